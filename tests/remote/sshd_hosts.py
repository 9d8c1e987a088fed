"""Real ``sshd`` processes on loopback, each a separate simulated GPU host.

Used by the ``tests/remote`` fixtures and by ``benchmarks/bench_remote.py``.
Everything lives in one temporary folder: host keys, the client key, the
``authorized_keys`` files, a client ``ssh_config`` (``-F``) with its own
``known_hosts`` -- ``~/.ssh`` is never read or written. Each sshd passes its
host's ``GPUSLATE_SIM``/``GPUSLATE_STATE_DIR`` and a ``PATH`` whose first entry
holds a ``gpuslate`` wrapper running this checkout's code (``SetEnv``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpuslate.gpu.simhost.host import SimHost

SRC = str(Path(__file__).resolve().parents[2] / "src")
SSHD = "/usr/sbin/sshd"
GiB = 1024**3


def sshd_available() -> bool:
    return os.path.isfile(SSHD) and os.access(SSHD, os.X_OK) and shutil.which("ssh") is not None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class SshHost:
    alias: str  # the Host name in the client ssh_config
    port: int
    root: Path  # this host's folder: sim/, state/, bin/
    sim: SimHost | None
    pid: int | None = None  # the sshd listener (None: an alias sharing another host's sshd)

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def env(self) -> dict[str, str]:
        """The environment a command on this host sees (for local comparisons)."""
        return {"GPUSLATE_SIM": str(self.sim.root) if self.sim else "",
                "GPUSLATE_STATE_DIR": str(self.state_dir), "GPUSLATE_LOCK_DIR": str(self.root / "locks")}


@dataclass
class SshLab:
    """A set of sshd hosts and the client configuration that reaches them."""

    base: Path
    hosts: dict[str, SshHost] = field(default_factory=dict)
    _sshd: list[tuple[int, str]] = field(default_factory=list)  # (pid, its config path)

    @property
    def ssh_config(self) -> Path:
        return self.base / "ssh_config"

    @property
    def control_dir(self) -> Path:
        return self.base / "cm"

    def client_env(self) -> dict[str, str]:
        """Environment for a local gpuslate that talks to these hosts."""
        env = dict(os.environ)
        env["PYTHONPATH"] = SRC + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["GPUSLATE_SSH_CONFIG"] = str(self.ssh_config)
        env["GPUSLATE_SSH_CONTROL_DIR"] = str(self.control_dir)
        env["GPUSLATE_STATE_DIR"] = str(self.base / "client-state")
        env.pop("GPUSLATE_SIM", None)
        return env

    def stop(self) -> None:
        self.close_masters()  # first: their sshd sessions end with them
        for pid, conf in self._sshd:  # only the sshd processes this lab started, checked by command line
            if _is_our_sshd(pid, conf):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while any(_is_our_sshd(pid, conf) for pid, conf in self._sshd) and time.monotonic() < deadline:
            time.sleep(0.02)  # another process's exit: no event to wait on

    def close_masters(self) -> None:
        """The ControlPersist masters the tests' gpuslate runs left: ask each to exit (ssh -O exit)."""
        if not self.control_dir.is_dir():
            return
        for sock in self.control_dir.iterdir():
            subprocess.run(["ssh", "-F", str(self.ssh_config), "-o", f"ControlPath={sock}", "-O", "exit", "x"],
                           capture_output=True, timeout=10, stdin=subprocess.DEVNULL)
            sock.unlink(missing_ok=True)

    def add_alias(self, alias: str, port: int, hostname: str = "127.0.0.1") -> None:
        """A client alias for HOSTNAME:PORT (a closed port, or a listener that never speaks)."""
        text = self.ssh_config.read_text()
        self.ssh_config.write_text(f"Host {alias}\n  HostName {hostname}\n  Port {port}\n  AddressFamily inet\n"
                                   f"  HostKeyAlias {alias}\n" + text)

    def add_rekeyed_alias(self, alias: str, port: int) -> None:
        """An alias whose known_hosts entry holds another key: the host key 'changed'."""
        _keygen(self.base / f"{alias}_old_key")
        old = (self.base / f"{alias}_old_key.pub").read_text().split()[:2]
        with open(self.base / "known_hosts", "a") as f:
            f.write(f"{alias} {' '.join(old)}\n")
        # another name for the address: ssh shares a master connection per (host, port, user),
        # which would skip the host key check that this alias is for
        self.add_alias(alias, port, hostname="localhost")


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpuslate-test", "-f", str(path)],
                   check=True, stdin=subprocess.DEVNULL)


def _wrapper(bin_dir: Path) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    w = bin_dir / "gpuslate"
    w.write_text(f"#!/bin/sh\nexec {sys.executable} -m gpuslate \"$@\"\n")
    w.chmod(0o755)


def start_lab(base: Path, names: list[str], *, gpus: int = 4, missing: tuple[str, ...] = (),
              refuse: tuple[str, ...] = (), extra_path: dict[str, Path] | None = None,
              aliases_per_sshd: int = 1, env: dict[str, dict[str, str]] | None = None) -> SshLab:
    """Start one sshd per name (``aliases_per_sshd`` > 1: several client aliases share
    one sshd and one simulated host). ``missing``: hosts without gpuslate on PATH;
    ``refuse``: hosts whose sshd accepts no key; ``env``: a host's own SetEnv values
    (``PATH``, ``PYTHONPATH``, ``HOME``...), replacing the defaults."""
    if os.geteuid() == 0:
        # sshd refuses to start without its privilege separation folder
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    base.mkdir(parents=True, exist_ok=True)
    lab = SshLab(base)
    _keygen(base / "client_key")
    (base / "authorized_keys").write_text((base / "client_key.pub").read_text())
    (base / "no_keys").write_text("")
    lab.control_dir.mkdir(mode=0o700, exist_ok=True)
    client: list[str] = []
    for name in names:
        root = base / name
        root.mkdir()
        _keygen(root / "host_key")
        sim = SimHost.init(root / "sim", gpus=gpus, memory=96 * GiB, name=name, release_delay=0.1)
        bin_dir = root / "bin"
        if name not in missing:
            _wrapper(bin_dir)
        else:
            bin_dir.mkdir()
        path = [str(bin_dir)]
        if extra_path and name in extra_path:
            path.append(str(extra_path[name]))
        path += ["/usr/local/bin", "/usr/bin", "/bin"]
        port = free_port()
        setenv = {"GPUSLATE_SIM": str(sim.root), "GPUSLATE_STATE_DIR": str(root / "state"),
                  "GPUSLATE_LOCK_DIR": str(root / "locks"), "PYTHONPATH": SRC, "PATH": ":".join(path),
                  # SHLVL=1: bash then skips ~/.bashrc for ssh commands (Debian sources it), so the
                  # test user's shell setup (pyenv, ...) is neither in the PATH nor in the timings
                  "SHLVL": "1", **(env or {}).get(name, {})}
        conf = root / "sshd_config"
        conf.write_text("\n".join([
            f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {root / 'host_key'}",
            f"PidFile {root / 'sshd.pid'}",
            f"AuthorizedKeysFile {base / ('no_keys' if name in refuse else 'authorized_keys')}",
            "UsePAM no", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
            "PubkeyAuthentication yes", "PermitRootLogin prohibit-password",
            "StrictModes no",  # the temporary folder's modes are the test runner's
            "MaxSessions 200", "MaxStartups 200:30:400", "LogLevel ERROR", "PrintMotd no",
            "SetEnv " + " ".join(f"{k}={v}" for k, v in setenv.items()),
            "",
        ]))
        # Daemonized (no -D): the listener is then no descendant of the test run, which a
        # 'clear' test taking the test runner's process group as a job would otherwise include.
        subprocess.run([SSHD, "-f", str(conf), "-E", str(root / "sshd.log")], stdin=subprocess.DEVNULL,
                       check=True, timeout=30)
        pid = _await_pid(root / "sshd.pid", root)
        lab._sshd.append((pid, str(conf)))
        host = SshHost(name, port, root, sim, pid)
        lab.hosts[name] = host
        for i in range(aliases_per_sshd):
            alias = name if aliases_per_sshd == 1 else f"{name}-{i}"
            client += [f"Host {alias}", "  HostName 127.0.0.1", f"  Port {port}",
                       f"  HostKeyAlias {name}"]
            if alias != name:
                lab.hosts[alias] = SshHost(alias, port, root, sim, None)
    client += ["Host *", f"  User {_user()}", f"  IdentityFile {base / 'client_key'}", "  IdentitiesOnly yes",
               f"  UserKnownHostsFile {base / 'known_hosts'}", "  GlobalKnownHostsFile /dev/null",
               "  StrictHostKeyChecking accept-new", "  LogLevel ERROR", ""]
    lab.ssh_config.write_text("\n".join(client))
    for name in names:
        _await_port(lab.hosts[name], base)
    return lab


def _is_our_sshd(pid: int, conf: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return conf.encode() in f.read()
    except OSError:
        return False


def _await_pid(pidfile: Path, root: Path, timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return int(pidfile.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            time.sleep(0.01)  # written by the daemon once it listens
    raise RuntimeError(f"sshd in {root} wrote no pid file: {(root / 'sshd.log').read_text()}")


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


def _await_port(host: SshHost, base: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if host.pid is not None and not _is_our_sshd(host.pid, str(host.root / "sshd_config")):
            raise RuntimeError(f"sshd for {host.alias} exited: {(host.root / 'sshd.log').read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", host.port), timeout=0.5) as s:
                if s.recv(4).startswith(b"SSH-"):
                    return
        except OSError:
            time.sleep(0.02)  # not listening yet: no event to await across processes
    raise RuntimeError(f"sshd for {host.alias} did not listen on {host.port}")
