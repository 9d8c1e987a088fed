"""Where gpuslate keeps per-user state (the audit log, unit records), and the walk that opens it.

The walk itself, and its rules (``Trust.PRIVATE`` for the state folder, ``Trust.SHARED``
for the lock folder, simulated hosts and paths named on the command line), are
:mod:`gpuslate._walk`, below every package so that the simulated GPUs' folder
(``gpu/``) is opened by the same code as the state folder; its names are
re-exported here. The state folder is walked under ``Trust.PRIVATE``: every
component from ``/`` owned by the invoking user or root and closed to others.
Root's state for another user's simulated host is therefore refused (set
``GPUSLATE_STATE_DIR``).
"""

from __future__ import annotations

import os
from pathlib import Path

from .._walk import FILE_FLAGS, StateDir, Trust, open_dir, open_file_dir, read_file
from ..errors import BackendUnavailable, PermissionDenied, UsageError
from ..gpu import sim_root_from_env

__all__ = ["FILE_FLAGS", "StateDir", "Trust", "check_private", "configured_dir", "open_dir", "open_file_dir",
           "open_state_dir", "read_file", "read_state_file", "state_dir", "write_state_file"]


# -- the state folder -------------------------------------------------------------


def open_state_dir(sim_root: str | os.PathLike[str] | None = None) -> StateDir:
    """The state folder (see :func:`state_dir` for where), created 0700 when missing, held open."""
    return open_dir(configured_dir(sim_root), create=True)


def state_dir(sim_root: str | os.PathLike[str] | None = None) -> Path:
    """``$GPUSLATE_STATE_DIR``; else, for a simulated host (``sim_root``, default
    ``$GPUSLATE_SIM``), ``SIM_ROOT/state``; else ``$XDG_STATE_HOME/gpuslate``, else
    ``~/.local/state/gpuslate``.

    Created with mode 0700 on first use (folders above it too); an existing
    folder is left as it is, but refused (:class:`PermissionDenied`) unless the
    walk of :func:`open_dir` accepts every component of its path.
    """
    with open_state_dir(sim_root) as d:
        return d.path


def check_private(path: Path, uid: int | None = None) -> None:
    """Refuse a state folder that someone other than ``uid`` (default: us) or root could change
    (the ``Trust.PRIVATE`` rules of :func:`open_dir`), or that does not exist."""
    try:
        open_dir(path, uid=uid).close()
    except FileNotFoundError as exc:
        raise PermissionDenied(f"cannot check {exc.strerror}") from None


def read_state_file(path: Path) -> bytes | None:
    """The bytes of a state file; ``None`` when it (or its folder) does not exist. Never through a symlink."""
    try:
        d = open_dir(path.parent)
    except FileNotFoundError:
        return None
    with d:
        return d.read(path.name)


def write_state_file(path: Path, data: bytes) -> None:
    """Replace a state file atomically (:meth:`StateDir.write_atomic`)."""
    with open_dir(path.parent) as d:
        d.write_atomic(path.name, data)


def absolute_setting(var: str, value: str) -> Path:
    """The folder an environment variable names, which must be absolute (``~`` expanded).

    A relative one is refused rather than made absolute: every gpuslate process would take it
    from its own current folder, so units recorded after one ``cd`` would "vanish" after the
    next, and two commands would not share a lock. (The XDG spec ignores a relative
    ``XDG_STATE_HOME``; ignoring this one would silently use another folder.)"""
    path = Path(value).expanduser()
    if not path.is_absolute():
        raise UsageError(f"{var} must be an absolute path, not {value!r}: a relative one would name another "
                         "folder from every folder gpuslate runs in", hint=f'export {var}="$PWD/{value}"')
    return path


def configured_dir(sim_root: str | os.PathLike[str] | None = None) -> Path:
    """Where the state folder is, not yet opened or checked: ``$GPUSLATE_STATE_DIR``, else the
    simulated host's ``state/`` (``sim_root`` or ``$GPUSLATE_SIM``), else the XDG state folder."""
    env = os.environ.get("GPUSLATE_STATE_DIR")
    if env:
        return absolute_setting("GPUSLATE_STATE_DIR", env)
    sim = sim_root if sim_root is not None else sim_root_from_env()
    if sim:
        # a simulated run never writes to the user's real audit log
        root = Path(sim).absolute()
        if not (root / "host.json").is_file():
            raise BackendUnavailable(f"no simulated host at {root}",
                                     hint=f"create one with 'gpuslate sim init {root}'")
        return root / "state"
    xdg = os.environ.get("XDG_STATE_HOME")
    # the XDG spec says a relative value is invalid and must be ignored
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "gpuslate"
    try:
        home = Path.home()
    except (RuntimeError, KeyError):  # no $HOME and no passwd entry (some containers)
        raise PermissionDenied("cannot find a home directory for the gpuslate state directory",
                               hint="set GPUSLATE_STATE_DIR to a writable directory") from None
    return home / ".local" / "state" / "gpuslate"
