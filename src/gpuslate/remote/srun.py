"""The srun transport: one gpuslate command on every node of the Slurm allocation
this process runs inside (``salloc``, an ``sbatch`` script), gathered as a fleet.

Inside an allocation Slurm sets ``SLURM_JOB_ID`` and ``SLURM_JOB_NODELIST`` (a
hostlist expression, expanded with the same bound as ``-H``). One ``srun``
runs one task per node (``--overlap``: beside the job's own steps, sharing its
CPUs and GPUs; ``--label``: every output line carries its task number), and
each task runs ``sh -c`` with the command as separate words (``"$@"``, never
re-parsed by a shell): it prints its node name, runs ``gpuslate COMMAND ...
--json``, and prints its exit status. Each node's lines become the same
(exit status, stdout, stderr) an ssh run gives, and :func:`gpuslate.remote.fleet.interpret`
reads them: schema check, named failures, ``gpuslate.fleet.v1``, exit 7 for
partial failure. A node that printed no exit status did not run the command
(srun could not start it there): it is unreachable, with srun's last words.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from .._document import MAX_DOCUMENT_BYTES
from ..errors import GpuslateError, HostUnreachable, UsageError
from .fleet import FleetResult, HostOutcome, interpret
from .hosts import HostSpec, expand_hostlist
from .ssh import SshOptions, SshResult, run_bounded, transport_error

#: what the whole srun may send, per node, beyond one document (a node's status is some 20 KB)
SRUN_BYTES_PER_NODE = 1 << 20
NODE_MARK = "@@gpuslate-node "
EXIT_MARK = "@@gpuslate-exit "
# "$@": the command's words as srun passed them, one argv word each
_TASK = f'printf "%s%s\\n" "{NODE_MARK}" "$SLURMD_NODENAME"; "$@"; printf "%s%d\\n" "{EXIT_MARK}" "$?"'
_LABELED = re.compile(r"\s*(\d+): ?(.*)")


class Allocation(NamedTuple):
    job_id: str
    nodes: list[str]


def allocation_from_env(env: Mapping[str, str]) -> Allocation:
    """The allocation this process runs in, from ``SLURM_JOB_ID`` and ``SLURM_JOB_NODELIST``."""
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not job or not nodelist:
        raise UsageError("--slurm runs a command on every node of the Slurm allocation it is inside: "
                         "SLURM_JOB_ID and SLURM_JOB_NODELIST are not set (run it under salloc or in an "
                         "sbatch script)")
    return Allocation(job, expand_hostlist(nodelist))


def remote_command(env: Mapping[str, str]) -> tuple[str, ...]:
    """What runs gpuslate on a node: ``$GPUSLATE_REMOTE_COMMAND``, else ``gpuslate``."""
    text = env.get("GPUSLATE_REMOTE_COMMAND", "").strip()
    return tuple(shlex.split(text)) if text else ("gpuslate",)


def srun_argv(nodes: Sequence[str], words: Sequence[str], command: Sequence[str]) -> list[str]:
    return ["srun", "--overlap", f"-N{len(nodes)}", "--ntasks-per-node=1", f"--nodelist={','.join(nodes)}",
            "--label", "--quiet", "--kill-on-bad-exit=0", "--", "sh", "-c", _TASK, "sh", *command, *words]


class _Task(NamedTuple):
    node: str | None
    exit: int | None
    stdout: str
    stderr: str


def split_output(stdout: str, stderr: str) -> dict[int, _Task]:
    """Each task's node name, exit status and own lines, from srun's labeled output (pure)."""
    out: dict[int, list[str]] = {}
    err: dict[int, list[str]] = {}
    for text, into in ((stdout, out), (stderr, err)):
        for line in text.splitlines():
            m = _LABELED.fullmatch(line)
            if m is not None:
                into.setdefault(int(m.group(1)), []).append(m.group(2))
    tasks: dict[int, _Task] = {}
    for task in sorted(set(out) | set(err)):
        node, code, lines = None, None, []
        for line in out.get(task, []):
            if line.startswith(NODE_MARK) and node is None:
                node = line[len(NODE_MARK):].strip() or None
            elif line.startswith(EXIT_MARK):
                rest = line[len(EXIT_MARK):].strip()
                code = int(rest) if rest.isdigit() else None
            else:
                lines.append(line)
        tasks[task] = _Task(node, code, "\n".join(lines) + ("\n" if lines else ""),
                            "\n".join(err.get(task, [])) + ("\n" if err.get(task) else ""))
    return tasks


def outcomes(hosts: Sequence[HostSpec], tasks: dict[int, _Task], srun_rc: int, srun_stderr: str,
             elapsed: float, *, too_large: bool = False, stalled: float | None = None) -> list[HostOutcome]:
    """One outcome per host, in host order, from the split output (pure). ``too_large``/``stalled``:
    srun was ended for its output or its time; a node that had not finished then failed so."""
    by_node = {t.node: t for t in tasks.values() if t.node is not None}
    unlabeled = [ln.strip() for ln in srun_stderr.splitlines() if ln.strip() and not _LABELED.fullmatch(ln)]
    out: list[HostOutcome] = []
    for h in hosts:
        t = by_node.get(h.address)
        err: GpuslateError | None
        if (t is None or t.exit is None) and (too_large or stalled is not None):
            err = transport_error(SshResult(-9, "", "", elapsed, too_large, stalled), h, SshOptions())
            out.append(HostOutcome(h, None, err, elapsed))
            continue
        if t is None or t.exit is None:
            last = (t.stderr.strip().splitlines()[-1:] if t is not None and t.stderr.strip() else []) or \
                unlabeled[-1:] or [f"srun exited {srun_rc}"]
            err = HostUnreachable(f"{h.label}: the command did not run there through srun ({last[0]})",
                                  hint="is the node in this allocation (SLURM_JOB_NODELIST) and up? "
                                  "try: srun --overlap -N1 -w " + h.address + " hostname")
            out.append(HostOutcome(h, None, err, elapsed))
            continue
        doc, err = interpret(h, SshResult(t.exit, t.stdout, t.stderr, elapsed), SshOptions())
        out.append(HostOutcome(h, doc, err, elapsed))
    return out


def run_allocation(hosts: Sequence[HostSpec], words: Sequence[str], *, env: Mapping[str, str] | None = None,
                   timeout: float | None = None) -> FleetResult:
    """``gpuslate WORDS`` on each of ``hosts`` (nodes of the current allocation) through one srun,
    bounded like an ssh run (:func:`~gpuslate.remote.ssh.run_bounded`): ``timeout`` seconds, and
    :data:`SRUN_BYTES_PER_NODE` per node plus one document's bytes in all (each node's document is
    then held to the document limit by its parser)."""
    env = os.environ if env is None else env
    argv = srun_argv([h.address for h in hosts], words, remote_command(env))
    try:
        run = run_bounded(argv, timeout=timeout, max_stdout=MAX_DOCUMENT_BYTES + len(hosts) * SRUN_BYTES_PER_NODE)
    except FileNotFoundError:
        raise HostUnreachable("no srun: 'srun' is not on PATH",
                              hint="install Slurm's client (apt-get install slurm-client)") from None
    res = run.text()
    return FleetResult(list(words), outcomes(hosts, split_output(res.stdout, res.stderr), res.returncode, res.stderr,
                                             res.elapsed_s, too_large=res.too_large, stalled=res.stalled))
