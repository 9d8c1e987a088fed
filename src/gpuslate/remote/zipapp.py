"""gpuslate for a host without a package index: one file, copied over SSH.

No gpuslate package is published, and GPU hosts often have no network to
fetch one: ``gpuslate --host H install`` builds a single-file zipapp of the
gpuslate running here (the standard library's :mod:`zipapp`) with the
pure-Python packages the core needs (rich and its own, tomli for Python
3.10) where they are importable here, and pushes it through the SSH
connection the fleet already uses (ssh's stdin, written by the remote
interpreter itself: no ``scp``, no heredoc, no shell beyond the one line).

On the host, in order: the interpreter is checked first (Python >= 3.10,
else :class:`~gpuslate.errors.RemotePythonUnsupported`); the archive and a
launcher are written atomically (a temporary file, fsync, rename) to
``PREFIX/share/gpuslate/gpuslate.pyz`` and ``PREFIX/bin/gpuslate`` (0755;
``PREFIX`` defaults to ``~/.local``) by :func:`write_installed`, the code of the
archive being installed (staged in a private temporary file and imported from
it): its folders are reached by the trusted-root walk of :mod:`gpuslate._walk`
under ``Trust.PRIVATE`` rules, every component from ``/`` (or, for ``~/...``,
from the user's home) the user's or root's and closed to others, so that a
folder on the way that is a link into another user's folder, or another
user's folder, is refused: root's launcher never runs what that user puts
there. Then the launcher is run (``--version`` and ``status --json``) to prove
it works. The launcher runs the interpreter that was checked, by its absolute path.

setproctitle, a C extension, is left out: only ``sim hold --title`` uses it,
and without it the title is the kernel's 15-character process name.
aiohttp and matplotlib are left out too (``bench``, ``sim serve``, plots).
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
import zipapp
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._document import Fields, checked, parse_json, reading
from .._version import __version__
from .._walk import Trust, open_dir
from ..errors import (
    BadDocument,
    GpuslateError,
    InstallFailed,
    PermissionDenied,
    RemoteCommandFailed,
    RemotePythonUnsupported,
    UsageError,
)
from ..outcome import Outcome, StatusEnum
from .fleet import DEFAULT_PARALLEL, FleetResult, HostOutcome, run_parallel
from .hosts import HostSpec
from .ssh import SshOptions, SshResult, remote_line, run_ssh, transport_error

if TYPE_CHECKING:
    from .transport import OnDone

SCHEMA = "gpuslate.install.v1"
DEFAULT_PREFIX = "~/.local"
MIN_PYTHON = (3, 10)
#: the pure-Python packages the core imports (rich and its dependencies; tomli on 3.10), when found here
BUNDLED = ("rich", "markdown_it", "mdurl", "pygments", "typing_extensions", "tomli")
_MAIN = "from gpuslate.cli import run\n\nrun()\n"
#: zip entries get this time: the same gpuslate gives the same archive (and sha256)
_EPOCH = time.mktime((2020, 1, 1, 0, 0, 0, 0, 0, -1))
_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo")
_EXTENSION = re.compile(r"\.(so|pyd|dylib)$")
_VERSION_LINE = re.compile(r"Python (\d+)\.(\d+)(?:\.(\d+))?")
_EX_CANTCREAT = 73  # the remote writer's exit status for files it could not write
#: seconds each step of an install may take on a host (the archive's copy is the longest)
INSTALL_STEP_S = 300.0


class InstallStatus(StatusEnum):
    INSTALLED = "installed", Outcome.DONE  # on a host, and it ran there
    WRITTEN = "written", Outcome.DONE  # the zipapp written locally (--out)


@dataclass(frozen=True)
class Archive:
    """A built zipapp: its bytes, and which bundled packages it has and lacks."""

    data: bytes
    included: tuple[str, ...]
    missing: tuple[str, ...]  # not importable here, or not pure Python

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


@dataclass(frozen=True)
class InstallResult:
    status: InstallStatus
    version: str  # gpuslate's
    sha256: str
    bytes: int
    pyz: str
    launcher: str | None = None
    python: str | None = None  # the remote interpreter the launcher runs
    python_version: str | None = None
    status_check: str | None = None  # "ok", or the error type of a status that ran but had no GPU backend
    remote_command: str | None = None  # what GPUSLATE_REMOTE_COMMAND must be, when the fleet will not find it
    bundled: tuple[str, ...] = ()
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "status": self.status.value, "version": self.version, "sha256": self.sha256,
                "bytes": self.bytes, "pyz": self.pyz, "launcher": self.launcher, "python": self.python,
                "python_version": self.python_version, "status_check": self.status_check,
                "remote_command": self.remote_command, "bundled": list(self.bundled), "warnings": self.warnings}

    @classmethod
    def from_json(cls, doc: object) -> InstallResult:
        f = Fields(checked(doc, SCHEMA))
        with reading(SCHEMA):
            text = f.opt_text
            return cls(f.choice("status", InstallStatus), str(text("version")), str(text("sha256")), f.size("bytes"),
                       str(text("pyz")), text("launcher"), text("python"), text("python_version"),
                       text("status_check"), text("remote_command"), tuple(f.texts("bundled")), f.texts("warnings"))


# -- building ----------------------------------------------------------------------------------------------------


def _source(name: str) -> Path | None:
    """The folder (package) or file (module) ``name`` is imported from here, if pure Python."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        locations = list(spec.submodule_search_locations)
        path = Path(locations[0]) if len(locations) == 1 else None
        if path is None or not path.is_dir() or any(_EXTENSION.search(p.name) for p in path.rglob("*")):
            return None
        return path
    origin = Path(spec.origin) if spec.origin else None
    return origin if origin is not None and origin.suffix == ".py" and origin.is_file() else None


def build() -> Archive:
    """The zipapp of the gpuslate running here and the bundled packages found here."""
    own = _source("gpuslate")
    if own is None:
        raise UsageError("cannot build the zipapp: the gpuslate package here is not a folder of Python files")
    included: list[str] = []
    missing: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gpuslate-pyz-") as tmp:
        stage = Path(tmp) / "app"
        shutil.copytree(own, stage / "gpuslate", ignore=_SKIP)
        for name in BUNDLED:
            src = _source(name)
            if src is None:
                missing.append(name)
            elif src.is_dir():
                shutil.copytree(src, stage / name, ignore=_SKIP)
                included.append(name)
            else:
                shutil.copy2(src, stage / src.name)
                included.append(name)
        # our own __main__.py (zipapp's main= stamps it with the time of the build)
        (stage / "__main__.py").write_text(_MAIN)
        for path in [stage, *stage.rglob("*")]:
            os.utime(path, (_EPOCH, _EPOCH))  # the same gpuslate, the same bytes (and sha256)
        out = io.BytesIO()
        zipapp.create_archive(stage, out, interpreter="/usr/bin/env python3", compressed=True)
    return Archive(out.getvalue(), tuple(included), tuple(missing))


def write_local(archive: Archive, out: str) -> InstallResult:
    """``install --out FILE``: the zipapp written here (0755, atomically; a link at FILE is replaced, not
    followed; its folder reached by the walk under ``Trust.SHARED`` rules: never another user's link)."""
    target = Path(out).absolute()
    try:
        with open_dir(target.parent, trust=Trust.SHARED, what="--out directory") as folder:
            folder.write_atomic(target.name, archive.data, 0o755, sync=True)
    except OSError as exc:
        why = exc.strerror if exc.strerror and not isinstance(exc, PermissionDenied) else str(exc)
        raise InstallFailed(f"cannot write {out}: {why}") from None
    return InstallResult(InstallStatus.WRITTEN, __version__, archive.sha256, len(archive.data), str(target.resolve()),
                         bundled=archive.included)


# -- installing on a host ---------------------------------------------------------------------------------------

#: run by the remote interpreter (any Python: the version is checked from its output)
_PROBE = 'import sys; print("Python %d.%d.%d" % tuple(sys.version_info[:3])); print(sys.executable)'

#: argv: PREFIX SIZE SHA256 VERSION; the archive on stdin, checked, staged in a private temporary file and imported
#: from: its own write_installed writes it (any Python >= 3.10 runs this; the version was checked first).
_WRITER = r"""
import hashlib, os, sys, tempfile
size, digest = int(sys.argv[2]), sys.argv[3]
data = sys.stdin.buffer.read(size + 1)
if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
    sys.stderr.write("gpuslate install: received %d of %d bytes, or other bytes\n" % (len(data), size))
    sys.exit(74)
fd, staged = tempfile.mkstemp(prefix="gpuslate-install-", suffix=".pyz")
try:
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    sys.path.insert(0, staged)
    from gpuslate.remote.zipapp import write_installed
    sys.exit(write_installed(sys.argv[1], data, sys.argv[4]))
finally:
    os.unlink(staged)
"""
_PREFIX_HINT = ("choose a prefix whose every folder is yours or root's and writable by nobody else: "
                "install --prefix DIR")


def write_installed(prefix: str, data: bytes, version: str) -> int:
    """The host's side of ``install`` (run by :data:`_WRITER` from the archive itself): the archive and
    its launcher written atomically into folders the trusted-root walk reached under ``Trust.PRIVATE``
    (module docstring), created 0755 where missing. Prints the two paths, and whether the launcher is
    where ``--host`` looks for it; returns the exit status (73: refused or not written)."""
    home = os.path.expanduser("~")
    below = home if prefix == "~" or prefix.startswith("~/") else None
    root = Path(prefix[1:].lstrip("/")) if below is not None else Path(prefix)
    pyz = os.path.join(os.path.expanduser(prefix), "share", "gpuslate", "gpuslate.pyz")
    launcher = os.path.join(os.path.expanduser(prefix), "bin", "gpuslate")
    text = (f"#!/bin/sh\n# gpuslate {version}, written by 'gpuslate --host HOST install' (docs/remote.md)\n"
            f"exec {shlex.quote(sys.executable)} {shlex.quote(pyz)} \"$@\"\n")
    try:
        for sub, name, content, mode in ((("share", "gpuslate"), "gpuslate.pyz", data, 0o644),
                                         (("bin",), "gpuslate", text.encode(), 0o755)):
            with open_dir(root.joinpath(*sub), trust=Trust.PRIVATE, create=True, mode=0o755, parents_mode=0o755,
                          what="install prefix", hint=_PREFIX_HINT, below=below) as folder:
                folder.write_atomic(name, content, mode, sync=True)
    except OSError as exc:  # the walk's refusal (PermissionDenied), or the kernel's
        why = exc.strerror if exc.strerror and not isinstance(exc, PermissionDenied) else str(exc)
        sys.stderr.write(f"gpuslate install: cannot write {exc.filename or prefix}: {why}\n")
        return _EX_CANTCREAT
    found = os.path.realpath(launcher) == os.path.realpath(os.path.join(home, ".local", "bin", "gpuslate"))
    print(json.dumps({"pyz": pyz, "launcher": launcher, "found": found}))
    return 0


def parse_python_version(text: str) -> tuple[int, int, int] | None:
    """The version the probe (or ``python3 --version``) printed, or None."""
    m = _VERSION_LINE.search(text)
    return None if m is None else (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))


def check_prefix(prefix: str) -> str:
    """``--prefix``: absolute, or under the remote home (``~/...``); one line, no control characters."""
    if not (prefix.startswith(("/", "~/")) or prefix == "~") or not prefix.isprintable():
        raise UsageError(f"invalid --prefix {prefix!r}: an absolute path on the host, or ~/...")
    return prefix


def _ssh(host: HostSpec, line: str, opts: SshOptions, data: bytes | None = None, timeout: float = INSTALL_STEP_S
         ) -> SshResult:
    """``line`` on ``host`` with ``data`` on its stdin, bounded like every ssh run (:func:`run_ssh`)."""
    return run_ssh(host, line, opts, timeout=timeout, data=data if data is not None else b"")


def _last(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _transport(res: SshResult, host: HostSpec, opts: SshOptions) -> GpuslateError | None:
    """ssh's own failures (unreachable, key, timeout) and a bound broken (too much output, too long);
    a missing command is the caller's to name."""
    broken = res.returncode == 255 or res.too_large or res.stalled is not None
    return transport_error(res, host, opts) if broken else None


def install_on_host(host: HostSpec, archive: Archive, opts: SshOptions, *, prefix: str = DEFAULT_PREFIX,
                    python: str = "python3") -> InstallResult:
    """Check the interpreter, write the archive and the launcher, run them; raises the named failure."""
    label = host.label
    probe = _ssh(host, remote_line([python, "-c", _PROBE]), opts)
    failed = _transport(probe, host, opts)
    if failed is not None:
        raise failed
    version = parse_python_version(probe.stdout if probe.returncode == 0 else "")
    if probe.returncode in (126, 127) or version is None:
        raise RemotePythonUnsupported(f"{label}: no usable {python} ({_last(probe.stderr) or 'no version printed'})",
                                      hint="install Python >= 3.10 there, or name it with install --python PATH")
    shown = ".".join(map(str, version))
    if version[:2] < MIN_PYTHON:
        raise RemotePythonUnsupported(f"{label}: {python} is Python {shown}; gpuslate needs Python >= 3.10",
                                      hint="install a newer Python there and name it with install --python PATH")
    lines = probe.stdout.splitlines()
    interpreter = lines[1].strip() if len(lines) > 1 and lines[1].strip().startswith("/") else python

    put = _ssh(host, remote_line([interpreter, "-c", _WRITER, prefix, str(len(archive.data)), archive.sha256,
                                  __version__]), opts, archive.data)
    failed = _transport(put, host, opts)
    if failed is not None:
        raise failed
    if put.returncode == _EX_CANTCREAT:
        raise InstallFailed(f"{label}: {_last(put.stderr).removeprefix('gpuslate install: ')}",
                            hint="choose a folder you may write there: install --prefix DIR")
    try:
        paths = parse_json(put.stdout)
        pyz, launcher, found = str(paths["pyz"]), str(paths["launcher"]), paths["found"] is True
    except (ValueError, KeyError, TypeError):  # BadDocument is a ValueError
        why = _last(put.stderr) or f"exit {put.returncode}"
        raise RemoteCommandFailed(f"{label}: writing the files failed ({why})",
                                  exit_code=put.returncode or 1) from None

    ran = _ssh(host, remote_line([launcher, "--version"]), opts)
    failed = _transport(ran, host, opts)
    if failed is not None:
        raise failed
    if ran.returncode != 0 or ran.stdout.strip() != f"gpuslate {__version__}":
        raise RemoteCommandFailed(f"{label}: installed, but {launcher} --version does not run "
                                  f"({_last(ran.stderr) or _last(ran.stdout) or f'exit {ran.returncode}'})",
                                  exit_code=ran.returncode or 1)
    check = _status_check(host, launcher, opts)
    warnings = []
    if "tomli" in archive.missing and version[:2] < (3, 11):
        warnings.append("no tomli was bundled (not importable where the zipapp was built): gpuslate.toml files "
                        "cannot be read with Python 3.10")
    return InstallResult(InstallStatus.INSTALLED, __version__, archive.sha256, len(archive.data), pyz,
                         launcher=launcher, python=interpreter, python_version=shown, status_check=check,
                         remote_command=None if found else launcher, bundled=archive.included, warnings=warnings)


def _status_check(host: HostSpec, launcher: str, opts: SshOptions) -> str:
    """``status --json`` through the launcher: "ok" for a status document; a host without a GPU backend
    (no driver: a login node) still proves that gpuslate runs, and says so by its error type."""
    res = _ssh(host, remote_line([launcher, "status", "--json"]), opts)
    failed = _transport(res, host, opts)
    if failed is not None:
        raise failed
    try:
        doc = parse_json(res.stdout)
    except BadDocument:
        doc = None
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if schema == "gpuslate.status.v1" and res.returncode == 0:
        return "ok"
    error = doc.get("error") if isinstance(doc, dict) else None
    if schema == "gpuslate.error.v1" and isinstance(error, dict) and isinstance(error.get("type"), str):
        return str(error["type"])
    raise RemoteCommandFailed(f"{host.label}: installed, but 'status --json' does not run there "
                              f"({_last(res.stderr) or f'exit {res.returncode}'})", exit_code=res.returncode or 1)


class ZipappPush:
    """``install``: the zipapp ``archive`` (built once, here) written on each host over ssh, its
    Python checked first and the installed gpuslate run once (:func:`.zipapp.install_on_host`).
    Every host at once, rolling too (an install changes nothing a later host depends on); the
    words each result lists are ``install --prefix PREFIX --python PYTHON``."""

    def __init__(self, hosts: Sequence[HostSpec], ssh: SshOptions, archive: Archive, *, prefix: str, python: str,
                 parallel: int = DEFAULT_PARALLEL) -> None:
        self._hosts, self.ssh, self.archive, self.parallel = list(hosts), ssh, archive, parallel
        self.prefix, self.python = prefix, python

    @property
    def hosts(self) -> list[HostSpec]:
        return self._hosts

    @property
    def words(self) -> list[str]:
        return ["install", "--prefix", self.prefix, "--python", self.python]

    def fan(self, hosts: Sequence[HostSpec], words: Sequence[str], on_done: OnDone) -> FleetResult:
        return run_parallel(hosts, self.words, self.ssh, parallel=self.parallel, on_done=on_done,
                            run_one=self._one)

    roll = fan

    def _one(self, host: HostSpec, words: Sequence[str]) -> HostOutcome:
        start = time.monotonic()
        try:
            result = install_on_host(host, self.archive, self.ssh, prefix=self.prefix, python=self.python)
        except GpuslateError as exc:
            return HostOutcome(host, None, exc, time.monotonic() - start)
        return HostOutcome(host, result.to_json(), None, time.monotonic() - start)
