"""The transport: the system OpenSSH client, so ``~/.ssh/config``, aliases,
``ProxyJump``, keys and agents work as they do for ``ssh`` itself.

Locally nothing goes through a shell (argv lists only); the one string the
remote shell sees is built here, every word ``shlex.quote``\\ d, so no value
(``--match``, unit names, paths, environment values) can run a command there.
Connections are reused (``ControlMaster=auto``, ``ControlPersist``) through
sockets in a private 0700 folder, so a multi-step command and a repeated call
pay one handshake per host.

What a host sends back is bounded (:func:`run_bounded`, also srun's and
``install``'s): at most :data:`~gpuslate._document.MAX_DOCUMENT_BYTES` on stdout
(the document; more and ssh is ended), the last 64 KiB of stderr (its last
lines name the failure), and a time limit the caller gives; a host past any of
them is ended (only the ssh process started for it) and its result says which.
"""

from __future__ import annotations

import os
import re
import selectors
import shlex
import stat
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from .._document import MAX_DOCUMENT_BYTES
from .._parse import parse_seconds
from ..errors import (
    BadDocument,
    GpuslateError,
    GpuslateMissing,
    HostAuthRefused,
    HostKeyChanged,
    HostStalled,
    HostTimedOut,
    HostUnreachable,
    PermissionDenied,
    UsageError,
)
from ..host.statedir import configured_dir
from .hosts import HostSpec

#: how long an idle shared connection stays open after the last command
CONTROL_PERSIST_S = 120
#: the time a host's answer may take beyond its connection and the command's own time limits
#: (``$GPUSLATE_ANSWER_MARGIN`` seconds where set: see :func:`answer_margin`)
ANSWER_MARGIN_S = 60.0


def answer_margin() -> float:
    """``$GPUSLATE_ANSWER_MARGIN`` (seconds), else :data:`ANSWER_MARGIN_S`: what a host's answer may take
    beyond ``--connect-timeout`` and the command's own ``--timeout`` and ``--grace``."""
    text = os.environ.get("GPUSLATE_ANSWER_MARGIN", "").strip()
    if not text:
        return ANSWER_MARGIN_S
    try:
        return parse_seconds(text)
    except UsageError as exc:
        raise UsageError(f"GPUSLATE_ANSWER_MARGIN: {exc}", hint="a number of seconds, e.g. 60") from None
#: a socket path must fit sun_path (108 bytes); %C expands to 40 hex digits
_MAX_CONTROL_DIR = 60
INSTALL_HINT = ("install it there: gpuslate --host HOST install (a single file, copied over ssh; docs/remote.md), "
                "or set GPUSLATE_REMOTE_COMMAND to the command that runs it, e.g. '/opt/venv/bin/gpuslate'")
DEFAULT_REMOTE_COMMAND = ("gpuslate",)
#: where ``install`` puts its launcher (the default --prefix ~/.local): tried when ``gpuslate`` is not on the
#: host's PATH (a non-interactive ssh command's PATH rarely has ~/.local/bin). Expanded by the remote shell.
INSTALLED_LAUNCHER = '"$HOME"/.local/bin/gpuslate'


class SshOptions(NamedTuple):
    connect_timeout: float = 10.0
    config: str | None = None  # -F FILE ($GPUSLATE_SSH_CONFIG); None: ssh's own (~/.ssh/config)
    control_dir: str | None = None  # None: no connection reuse
    remote_command: tuple[str, ...] = DEFAULT_REMOTE_COMMAND

    @classmethod
    def from_env(cls, connect_timeout: float = 10.0) -> SshOptions:
        remote = os.environ.get("GPUSLATE_REMOTE_COMMAND", "").strip()
        return cls(connect_timeout=connect_timeout, config=os.environ.get("GPUSLATE_SSH_CONFIG") or None,
                   control_dir=str(control_dir()),
                   remote_command=tuple(shlex.split(remote)) if remote else DEFAULT_REMOTE_COMMAND)


#: the part of a host's stderr that is kept (its last lines name what failed)
STDERR_KEPT = 64 << 10


class SshResult(NamedTuple):
    """What one run gave. Text is decoded losslessly (``surrogateescape``): a document that is not
    UTF-8 is refused by its parser, not silently repaired."""

    returncode: int
    stdout: str
    stderr: str
    elapsed_s: float
    too_large: bool = False  # stdout went past the byte limit: the run was ended
    stalled: float | None = None  # the time limit (seconds) the run went past: it was ended


class Bounded(NamedTuple):
    returncode: int
    stdout: bytes
    stderr: bytes  # its last STDERR_KEPT bytes
    elapsed_s: float
    too_large: bool
    stalled: float | None

    def text(self) -> SshResult:
        return SshResult(self.returncode, self.stdout.decode("utf-8", "surrogateescape"),
                         self.stderr.decode("utf-8", "surrogateescape"), self.elapsed_s, self.too_large,
                         self.stalled)


def run_bounded(argv: Sequence[str], *, data: bytes | None = None, timeout: float | None = None,
                max_stdout: int = MAX_DOCUMENT_BYTES) -> Bounded:
    """Run ``argv`` with ``data`` on its stdin, reading its stdout (at most ``max_stdout`` bytes) and
    stderr (the last :data:`STDERR_KEPT` kept) as they come; past the byte limit or ``timeout``
    seconds it is killed (by its pid: only the process started here) and the result says so.
    Memory is bounded whatever the other side sends; a peer that sends a valid prefix and then
    nothing is ended by the time limit, one that never stops by the byte limit."""
    start = time.monotonic()
    deadline = None if timeout is None else start + timeout
    p = subprocess.Popen(list(argv), stdin=subprocess.PIPE if data is not None else subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = bytearray(), bytearray()
    too_large, stalled = False, None
    sel = selectors.DefaultSelector()
    assert p.stdout is not None and p.stderr is not None
    sel.register(p.stdout, selectors.EVENT_READ, out)
    sel.register(p.stderr, selectors.EVENT_READ, err)
    pending = memoryview(data or b"")
    if p.stdin is not None:
        os.set_blocking(p.stdin.fileno(), False)
        sel.register(p.stdin, selectors.EVENT_WRITE, None)
    try:
        while sel.get_map() and not too_large:
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                stalled = timeout
                break
            for key, _ in sel.select(wait):
                if key.data is None:  # stdin: the next part of data
                    try:
                        pending = pending[os.write(key.fd, pending[:1 << 16]):]
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:  # the other side stopped reading: what it says next tells why
                        pending = pending[:0]
                    if not pending:
                        sel.unregister(key.fileobj)
                        key.fileobj.close()  # type: ignore[union-attr]
                    continue
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                into: bytearray = key.data
                into += chunk
                if into is out and len(out) > max_stdout:
                    too_large = True
                    break
                if into is err and len(err) > 2 * STDERR_KEPT:
                    del err[:-STDERR_KEPT]
        if not (too_large or stalled):
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                p.wait(wait)  # both pipes ended: it is exiting
            except subprocess.TimeoutExpired:
                stalled = timeout
    finally:
        sel.close()
        if p.poll() is None:
            p.kill()
        for f in (p.stdin, p.stdout, p.stderr):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass
        p.wait()
    return Bounded(p.returncode, bytes(out[:max_stdout]), bytes(err[-STDERR_KEPT:]), time.monotonic() - start,
                   too_large, stalled)


def control_dir() -> Path:
    """The private folder for shared-connection sockets: ``$GPUSLATE_SSH_CONTROL_DIR``,
    else ``$XDG_RUNTIME_DIR/gpuslate-ssh``, else ``<state dir>/ssh``, else (a path too
    long for a socket) ``/tmp/gpuslate-ssh-UID``. Created 0700; an existing one must be
    a real folder owned by this user and closed to others (never followed through a link)."""
    env = os.environ.get("GPUSLATE_SSH_CONTROL_DIR")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    candidates: list[Path] = []
    if runtime and os.path.isabs(runtime):
        candidates.append(Path(runtime) / "gpuslate-ssh")
    try:
        candidates.append(configured_dir() / "ssh")
    except GpuslateError:
        pass
    candidates.append(Path(f"/tmp/gpuslate-ssh-{os.geteuid()}"))
    # an explicit folder is used as given; the defaults must leave room for the socket name
    path = Path(env) if env else next((p for p in candidates if len(str(p)) <= _MAX_CONTROL_DIR),
                                      candidates[-1])
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise PermissionDenied(f"cannot create the ssh control folder {path}: {exc.strerror or exc}",
                               hint="set GPUSLATE_SSH_CONTROL_DIR to a private writable folder") from None
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise PermissionDenied(f"refusing the ssh control folder {path}: it must be a folder of yours "
                               "with mode 0700 (not a link)",
                               hint="remove it, or set GPUSLATE_SSH_CONTROL_DIR")
    return path


def remote_line(words: Sequence[str]) -> str:
    """The command line the remote shell runs: every word quoted, so it stays one word."""
    return " ".join(shlex.quote(w) for w in words)


def ssh_argv(host: HostSpec, line: str, opts: SshOptions) -> list[str]:
    """ssh's argv for running ``line`` (built by :func:`remote_line`) on ``host``."""
    argv = ["ssh"]
    if opts.config:
        argv += ["-F", opts.config]
    argv += ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, round(opts.connect_timeout))}",
             # a connection that dies mid-command is noticed instead of hanging
             "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3"]
    if opts.control_dir:
        argv += ["-o", "ControlMaster=auto", "-o", f"ControlPersist={CONTROL_PERSIST_S}",
                 "-o", f"ControlPath={opts.control_dir}/%C"]
    if host.port is not None:
        argv += ["-p", str(host.port)]
    if host.user:
        argv += ["-l", host.user]
    # "--": the destination is never read as an option (parse_host also refuses a leading '-')
    return argv + ["--", host.address, line]


def run_ssh(host: HostSpec, line: str, opts: SshOptions, *, timeout: float | None = None,
            data: bytes | None = None) -> SshResult:
    """Run ``line`` (from :func:`remote_line`) on ``host``, ``data`` on its stdin; bounded as
    :func:`run_bounded` says (``timeout``: seconds for the whole run, the connection included)."""
    try:
        return run_bounded(ssh_argv(host, line, opts), data=data, timeout=timeout).text()
    except FileNotFoundError:
        raise HostUnreachable("no ssh client: 'ssh' is not on PATH",
                              hint="install OpenSSH's client (apt-get install openssh-client)") from None


# ssh's own failures (exit 255): the first matching pattern names the failure
_SSH_FAILURES: tuple[tuple[re.Pattern[str], type[GpuslateError], str], ...] = (
    (re.compile(r"REMOTE HOST IDENTIFICATION HAS CHANGED|POSSIBLE DNS SPOOFING", re.I), HostKeyChanged,
     "the host key changed since it was recorded in known_hosts"),
    (re.compile(r"Host key verification failed|No \S+ host key is known", re.I), HostKeyChanged,
     "the host key is not known (BatchMode never asks)"),
    (re.compile(r"Permission denied|Too many authentication failures|no more authentication methods", re.I),
     HostAuthRefused, "authentication refused"),
    (re.compile(r"timed out|Operation timed out", re.I), HostTimedOut, "timed out"),
)


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("@@@")]
    return lines[-1] if lines else ""


def transport_error(result: SshResult, host: HostSpec, opts: SshOptions) -> GpuslateError | None:
    """The named failure of an ssh run that did not reach (or could not run) gpuslate, or that was
    ended for breaking a bound (too much output, too long), else None."""
    detail = _last_line(result.stderr)
    if result.too_large:
        return BadDocument(f"{host.label}: its answer was cut off: more than {MAX_DOCUMENT_BYTES} bytes",
                           hint="a gpuslate document is far smaller: is GPUSLATE_REMOTE_COMMAND a gpuslate?")
    if result.stalled is not None:
        return HostStalled(f"{host.label}: no complete answer within {result.stalled:g} s",
                           hint="the limit is --connect-timeout, plus the command's own --timeout and --grace, "
                           "plus GPUSLATE_ANSWER_MARGIN (default 60 s; docs/remote.md, Failures)")
    if result.returncode == 255:
        for pattern, cls, what in _SSH_FAILURES:
            if pattern.search(result.stderr):
                if cls is HostTimedOut:
                    return HostTimedOut(f"{host.label}: {what} ({detail})",
                                        hint=f"the connect timeout is {opts.connect_timeout:g} s (--connect-timeout)")
                hint = (f"if the change is expected: ssh-keygen -R {host.address}, then connect once by hand"
                        if cls is HostKeyChanged else f"check the key and user: ssh -v {host.ssh_words} true")
                return cls(f"{host.label}: {what} ({detail})", hint=hint)
        return HostUnreachable(f"{host.label}: unreachable ({detail or 'ssh exited 255'})",
                               hint=f"try: ssh {host.ssh_words} true")
    if missing(result):
        return GpuslateMissing(f"{host.label}: gpuslate is not installed ({detail})", hint=INSTALL_HINT)
    return None


def missing(result: SshResult) -> bool:
    """The remote shell could not find the gpuslate command (127), or Python its module."""
    err = result.stderr
    return (result.returncode == 127 or (result.returncode == 126 and "Permission denied" not in err)
            or (result.returncode == 1 and "No module named gpuslate" in err and not result.stdout.strip()))
