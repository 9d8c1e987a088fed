"""The transport: the system OpenSSH client, so ``~/.ssh/config``, aliases,
``ProxyJump``, keys and agents work as they do for ``ssh`` itself.

Locally nothing goes through a shell (argv lists only); the one string the
remote shell sees is built here, every word ``shlex.quote``\\ d, so no value
(``--match``, unit names, paths, environment values) can run a command there.
Connections are reused (``ControlMaster=auto``, ``ControlPersist``) through
sockets in a private 0700 folder, so a multi-step command and a repeated call
pay one handshake per host.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from ..errors import (
    GpuslateError,
    GpuslateMissing,
    HostAuthRefused,
    HostKeyChanged,
    HostTimedOut,
    HostUnreachable,
    PermissionDenied,
)
from ..host.state import configured_dir
from .hosts import HostSpec

#: how long an idle shared connection stays open after the last command
CONTROL_PERSIST_S = 120
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


class SshResult(NamedTuple):
    returncode: int
    stdout: str
    stderr: str
    elapsed_s: float


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


def run_ssh(host: HostSpec, line: str, opts: SshOptions, *, timeout: float | None = None) -> SshResult:
    """Run ``line`` (from :func:`remote_line`) on ``host``; a hard ``timeout`` (seconds) ends ssh and reads as exit 255
    with a 'timed out' message, like ssh's own connect timeout."""
    start = time.monotonic()
    try:
        p = subprocess.run(ssh_argv(host, line, opts), stdin=subprocess.DEVNULL, capture_output=True,
                           timeout=timeout, text=True, errors="replace")
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        return SshResult(255, "", err + f"\ngpuslate: ssh timed out after {timeout:g} s", time.monotonic() - start)
    except FileNotFoundError:
        raise HostUnreachable("no ssh client: 'ssh' is not on PATH",
                              hint="install OpenSSH's client (apt-get install openssh-client)") from None
    return SshResult(p.returncode, p.stdout, p.stderr, time.monotonic() - start)


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
    """The named failure of an ssh run that did not reach (or could not run) gpuslate, else None."""
    detail = _last_line(result.stderr)
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
