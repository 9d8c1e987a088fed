"""Asking Slurm: ``scontrol`` found, run with bounded time and output, and what it says read.

``scontrol`` is looked up on ``PATH``, or on :data:`DEFAULT_PATH` when ``PATH``
is unset (Slurm runs Prolog/Epilog without one). Its output is read up to
:data:`MAX_OUTPUT` bytes within the time limit, and it must have exited within
that same limit, counted from its start: the wait after its answer (both pipes
at their end) is bounded too, so a ``scontrol`` that prints, closes its output
and hangs is ended at the limit, never waited for. More output, or later, is an
error, never a partial answer taken for a whole one. Times are asked as epoch seconds
(``SLURM_TIME_FORMAT=%s``), so no time zone stands between Slurm and ``/proc``.

What the epilog's second rule needs to know about the node (:class:`NodeJobs`,
:func:`node_jobs`), read from three answers: ``scontrol -o -d show job`` (every
job Slurm still shows, with the GRES indexes each holds on each node),
``scontrol -o show node NODE`` (its GRES: ``mps`` or ``shard`` share GPUs
between jobs) and ``scontrol -o show partition`` (``OverSubscribe``). The
parsers are pure; anything they cannot read, or that the answer does not state,
makes the fact unknown, and unknown never widens (see :mod:`.leftover`): a node
line without ``Gres=`` (Slurm always prints it) or ``Partitions=`` (printed for
a node in a partition: the ended job ran in one), an empty answer with exit 0,
a job without ``JobState=`` (it may still be present) or ``NodeList=`` (it may
be on the node) never reads as "no sharing GRES", "no partition", "no job".
"""

from __future__ import annotations

import os
import re
import select
import shutil
import subprocess
import time
from collections.abc import Iterable
from typing import NamedTuple

from ..errors import UsageError
from ..remote.hosts import expand_hostlist

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TIMEOUT_S = 20.0
#: the most of one answer that is read (every job of a large cluster, one line each, fits)
MAX_OUTPUT = 64 << 20
#: GRES that let jobs share a GPU
SHARING_GRES = frozenset({"mps", "shard"})
#: job states in which a job may still have processes on its nodes
#: a job's state when its line does not state one: it may be present
UNKNOWN_STATE = "?"
PRESENT_STATES = frozenset({"RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING", "STOPPED", "RESIZING",
                            "SIGNALING", "STAGE_OUT", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})


def printable(text: str) -> str:
    """One line of printable characters (anything else becomes '?')."""
    return "".join(c if c.isprintable() else "?" for c in text)


def find() -> str | None:
    return shutil.which("scontrol", path=os.environ.get("PATH") or DEFAULT_PATH)


def not_found() -> str:
    return (f"scontrol not found on PATH ({os.environ.get('PATH') or DEFAULT_PATH}): "
            "install slurm-client or set PATH")


def run(args: list[str], *, timeout: float = TIMEOUT_S, limit: int = MAX_OUTPUT) -> tuple[str, str | None]:
    """``scontrol ARGS``: (stdout, None), or ("", what went wrong)."""
    exe = find()
    if exe is None:
        return "", not_found()
    try:
        p = subprocess.Popen([exe, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env={**os.environ, "SLURM_TIME_FORMAT": "%s"})
    except OSError as exc:
        return "", f"cannot run {exe}: {exc.strerror or exc}"
    deadline = time.monotonic() + timeout
    out, err, problem = _read(p, deadline, limit)
    if problem is None:
        try:  # its answer is in; it must exit within the same limit (one that hangs on is ended)
            rc = p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            problem = "scontrol did not exit within {timeout} s (its answer was in)"
    if problem is not None:
        p.kill()
        p.wait()
        for f in (p.stdout, p.stderr):
            if f is not None:
                f.close()
        return "", problem.format(timeout=f"{timeout:g}", limit=limit)
    if rc != 0:
        text = err.decode("utf-8", "replace").strip()
        detail = printable((text.splitlines() or [f"exit {rc}"])[-1])[:200]
        return "", f"scontrol failed: {detail}"
    return out.decode("utf-8", "replace"), None


def _read(p: subprocess.Popen[bytes], deadline: float, limit: int) -> tuple[bytes, bytes, str | None]:
    """Both pipes to their end, at most ``limit`` bytes of stdout (and 64 KiB of stderr) by ``deadline``."""
    assert p.stdout is not None and p.stderr is not None
    out_fd, err_fd = p.stdout.fileno(), p.stderr.fileno()
    bufs = {out_fd: bytearray(), err_fd: bytearray()}
    caps = {out_fd: limit, err_fd: 64 << 10}
    open_fds = set(bufs)
    while open_fds:
        left = deadline - time.monotonic()
        if left <= 0:
            return b"", b"", "scontrol did not answer within {timeout} s"
        ready, _, _ = select.select(list(open_fds), [], [], left)
        for fd in ready:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                open_fds.discard(fd)
                continue
            bufs[fd] += chunk
            if len(bufs[fd]) > caps[fd]:
                if fd == out_fd:
                    return b"", b"", "scontrol wrote more than {limit} bytes"
                del bufs[fd][caps[fd]:]
    p.stdout.close()
    p.stderr.close()
    return bytes(bufs[out_fd]), bytes(bufs[err_fd]), None


# -- what the answers say (pure) ------------------------------------------------------------------

class JobOnNode(NamedTuple):
    """A job Slurm shows on this node."""

    job_id: int
    uid: int | None  # None: not read
    state: str
    start: int | None  # epoch seconds (Slurm's, rounded down); None: unknown
    end: int | None  # epoch seconds; None: not ended, or unknown
    gpus: frozenset[int] | None  # its GRES gpu indexes on this node; None: not read (unknown)
    shares: bool  # it holds a GRES that shares GPUs (mps, shard) on this node

    @property
    def present(self) -> bool:
        """In a state in which it may still have processes here (``CANCELLED+COMPLETING`` too); a
        state the answer did not state (``?``) may be one."""
        return self.state == UNKNOWN_STATE or any(part in PRESENT_STATES for part in self.state.split("+"))


class NodeJobs(NamedTuple):
    """What the second rule needs to know about the node, from Slurm."""

    node: str
    jobs: tuple[JobOnNode, ...]  # every job Slurm shows on the node, the ended one included
    shared_gres: bool  # the node has a GRES that shares GPUs between jobs (mps, shard)
    oversubscribe: tuple[str, ...]  # the partitions of the node that oversubscribe (OverSubscribe=YES/FORCE)
    error: str | None = None  # what could not be read; then nothing above is known

    def job(self, job_id: int) -> JobOnNode | None:
        return next((j for j in self.jobs if j.job_id == job_id), None)


_GRES_ITEM = re.compile(r"([A-Za-z][\w-]*)(?::[^:,(]+)?:(\d+)(?:\((?:IDX:([^)]*)|[^)]*)\))?")


def _number(text: str | None) -> int | None:
    return int(text) if text is not None and text.isascii() and text.isdigit() and len(text) <= 12 else None


def _fields(line: str) -> list[tuple[str, str]]:
    """``K=V`` words of a one-line (``-o``) answer, in order (a key may repeat: ``Nodes=``)."""
    return [(k, v) for word in line.split() for k, sep, v in [word.partition("=")] if sep]


def _indexes(text: str) -> frozenset[int] | None:
    """``0-1,3`` -> {0, 1, 3}; None when it does not read."""
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        a, b = _number(lo), _number(hi) if hi else _number(lo)
        if a is None or b is None or b < a or b - a > 4096:
            return None
        out.update(range(a, b + 1))
    return frozenset(out)


def parse_gres(text: str) -> tuple[frozenset[int] | None, bool]:
    """A job's ``GRES=`` on one node (``gpu:2(IDX:0-1)``, ``gpu:a100:1(IDX:3),shard:2(...)``, empty):
    (its gpu indexes, None when a gpu entry does not read; whether it holds a sharing GRES)."""
    gpus: set[int] = set()
    shares = False
    rest = text.strip()
    if rest in ("", "(null)"):
        return frozenset(), False
    pos = 0
    while pos < len(rest):
        m = _GRES_ITEM.match(rest, pos)
        if m is None:
            return None, shares
        name = m.group(1).lower()
        if name in SHARING_GRES:
            shares = True
        elif name == "gpu":
            idx = _indexes(m.group(3)) if m.group(3) is not None else None
            if idx is None:
                return None, shares
            gpus |= idx
        pos = m.end()
        if pos < len(rest):
            if rest[pos] != ",":
                return None, shares
            pos += 1
    return frozenset(gpus), shares


def _on(node: str, nodes: str) -> bool | None:
    """Whether ``node`` is in the hostlist ``nodes`` (None: it does not read)."""
    if nodes in ("", "(null)"):
        return False
    try:
        names = expand_hostlist(nodes)
    except UsageError:
        return None
    if any("[" in n or "]" in n for n in names):  # a bracket left over: it did not read
        return None
    return node in names


def parse_job(line: str, node: str) -> JobOnNode | None:
    """One job of ``scontrol -o -d show job``, as far as it concerns ``node``; None when it is not
    on the node (or is not a job line)."""
    fields = _fields(line)
    first = dict(reversed(fields))  # a repeated key: its first value
    job_id = _number(first.get("JobId"))
    if job_id is None:
        return None
    on = _on(node, first["NodeList"]) if "NodeList" in first else None  # not stated: it may be on the node
    if on is False:
        return None
    uid_text = first.get("UserId", "")
    uid = _number(uid_text[uid_text.find("(") + 1:-1] if uid_text.endswith(")") else None)
    state = first.get("JobState", UNKNOWN_STATE).upper() or UNKNOWN_STATE
    # the per-node detail: Nodes=HOSTLIST CPU_IDs=... Mem=... GRES=..., one group per set of nodes
    gpus: frozenset[int] | None = frozenset()
    shares, matched = False, False
    group_on: bool | None = False
    for k, v in fields:
        if k == "Nodes":
            group_on = _on(node, v)
            matched = matched or group_on is not False
            if group_on is None:
                gpus = None
        elif k == "GRES" and group_on is not False:
            got, sh = parse_gres(v)
            shares = shares or sh
            gpus = None if got is None or gpus is None or group_on is None else gpus | got
    if on is None or not matched:  # on the node by its NodeList, but no detail says what it holds here
        gpus = None
    return JobOnNode(job_id, uid, state, _number(first.get("StartTime")), _number(first.get("EndTime")), gpus, shares)


def parse_node(text: str, node: str) -> tuple[bool, tuple[str, ...]] | str:
    """``scontrol -o show node NODE``: (a GRES that shares GPUs, its partitions); or, when the answer
    does not state them for ``node``, what it left out (the facts are then unknown)."""
    lines = [first for line in text.splitlines() if (first := dict(reversed(_fields(line)))).get("NodeName") == node]
    if len(lines) != 1:
        return f"scontrol show node {node} did not show that node" if not lines else \
            f"scontrol show node {node} showed that node {len(lines)} times"
    first = lines[0]
    missing = [k for k in ("Gres", "Partitions") if k not in first]
    if missing:
        return f"scontrol show node {node} did not state {' or '.join(k + '=' for k in missing)}"
    gres = first["Gres"]
    shared = any(item.split(":", 1)[0].lower() in SHARING_GRES for item in gres.split(",") if item)
    parts = tuple(p for p in first["Partitions"].split(",") if p and p != "(null)")
    if not parts:
        return f"scontrol show node {node} stated no partition"
    return shared, parts


def oversubscribing(text: str, partitions: Iterable[str]) -> tuple[str, ...]:
    """Of ``partitions``, those ``scontrol -o show partition`` shows with ``OverSubscribe`` other
    than NO or EXCLUSIVE (YES, FORCE: jobs may share what they were allocated); a partition not
    shown counts as oversubscribing (unknown)."""
    wanted = set(partitions)
    seen: dict[str, str] = {}
    for line in text.splitlines():
        first = dict(reversed(_fields(line)))
        name = first.get("PartitionName")
        if name in wanted:
            seen[name] = first.get("OverSubscribe", "?").split(":")[0].upper()
    return tuple(sorted(p for p in wanted if seen.get(p) not in ("NO", "EXCLUSIVE")))


def node_jobs(node: str, *, timeout: float = TIMEOUT_S) -> NodeJobs:
    """Ask Slurm about ``node`` (three answers within ``timeout`` in all)."""
    deadline = time.monotonic() + timeout
    shown, error = run(["-o", "-d", "show", "job"], timeout=timeout)
    node_text, error2 = ("", error) if error else run(["-o", "show", "node", node],
                                                      timeout=max(0.1, deadline - time.monotonic()))
    read = parse_node(node_text, node) if error2 is None else error2
    if isinstance(read, str):
        return NodeJobs(node, (), False, (), read)
    shared, partitions = read
    part_text, error3 = run(["-o", "show", "partition"], timeout=max(0.1, deadline - time.monotonic()))
    if error3 is not None:
        return NodeJobs(node, (), False, (), error3)
    jobs = tuple(j for line in shown.splitlines() if (j := parse_job(line, node)) is not None)
    return NodeJobs(node, jobs, shared, oversubscribing(part_text, partitions))
