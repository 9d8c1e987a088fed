"""Where gpuslate keeps per-user state (the audit log, unit records): one private folder per user.

State files decide what gpuslate signals and record what it did, so they are
opened as OpenSSH opens ``authorized_keys`` under ``StrictModes``: the folder
and each folder above it, up to the first one the invoking user owns, must be
owned by that user or root and writable by nobody else, and no state file is
ever followed through a symbolic link (``O_NOFOLLOW``) or leaked to a server
gpuslate starts (``O_CLOEXEC``). Otherwise another user who can write there
could make a root ``clear`` append to a file of their choosing.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from ..errors import PermissionDenied

#: flags for every state file: never through a symlink, never inherited by a child
SAFE_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC


def state_dir(sim_root: str | os.PathLike[str] | None = None) -> Path:
    """``$GPUSLATE_STATE_DIR``; else, for a simulated host (``sim_root``, default
    ``$GPUSLATE_SIM``), ``SIM_ROOT/state``; else ``$XDG_STATE_HOME/gpuslate``, else
    ``~/.local/state/gpuslate``.

    Created with mode 0700 on first use; an existing folder is left as it is, but
    refused (:class:`PermissionDenied`) unless :func:`check_private` accepts it.
    """
    path = _configured_dir(sim_root)
    try:
        path.mkdir(mode=0o700, parents=True)
        # mkdir's mode goes through the umask; an odd umask must not lock us out
        os.chmod(path, 0o700)
    except FileExistsError:
        if not path.is_dir():
            raise PermissionDenied(f"cannot use state directory {path}: it exists and is not a directory") from None
    except OSError as exc:
        raise PermissionDenied(f"cannot create state directory {path}: {exc.strerror or exc}",
                               hint="set GPUSLATE_STATE_DIR to a writable directory") from None
    check_private(path)
    return path


def check_private(path: Path, uid: int | None = None) -> None:
    """Refuse a state folder that someone other than ``uid`` (default: us) or root could change.

    Like sshd's ``safe_path``: the real path (symlinks resolved) and each folder
    above it must be owned by ``uid`` or root and not writable by group or others,
    walking up until a folder owned by ``uid`` itself has been checked (above it,
    only ``uid`` or root can rename anything) or ``/`` is reached.
    """
    uid = os.geteuid() if uid is None else uid
    current = Path(os.path.realpath(path))
    while True:
        try:
            st = os.stat(current)
        except OSError as exc:
            raise PermissionDenied(f"cannot check state directory {current}: {exc.strerror or exc}") from None
        if st.st_uid not in (uid, 0):
            raise PermissionDenied(
                f"refusing state directory {path}: {current} is owned by uid {st.st_uid}, not by you (uid {uid}) "
                "or root", hint="use a folder of your own: set GPUSLATE_STATE_DIR")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            who = " and ".join(w for bit, w in ((stat.S_IWGRP, "group"), (stat.S_IWOTH, "others")) if st.st_mode & bit)
            raise PermissionDenied(
                f"refusing state directory {path}: {current} is writable by {who} (mode {stat.S_IMODE(st.st_mode):o})",
                hint=f"chmod go-w {current}, or set GPUSLATE_STATE_DIR to a private folder")
        if st.st_uid == uid or current.parent == current:
            return
        current = current.parent


def open_state_file(path: Path, flags: int, mode: int = 0o600) -> int:
    """``os.open`` of a state file with :data:`SAFE_FLAGS`; a symlink is refused
    with :class:`PermissionDenied` (other errors, e.g. ``FileNotFoundError``, propagate)."""
    try:
        return os.open(path, flags | SAFE_FLAGS, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PermissionDenied(f"refusing state file {path}: it is a symbolic link") from None
        raise


def read_state_file(path: Path) -> bytes | None:
    """The bytes of a state file; ``None`` when it does not exist. Never through a symlink."""
    try:
        fd = open_state_file(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read()


def write_state_file(path: Path, data: bytes) -> None:
    """Replace a state file atomically: readers see the old content or the new, never half.

    The temporary file is created exclusively (``O_EXCL``: a planted file or
    symlink there is never written through); ``rename`` replaces a symlink at
    ``path`` itself rather than following it.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        os.unlink(tmp)  # a leftover of a crashed run with our pid
    except FileNotFoundError:
        pass
    fd = open_state_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _configured_dir(sim_root: str | os.PathLike[str] | None = None) -> Path:
    env = os.environ.get("GPUSLATE_STATE_DIR")
    if env:
        return Path(env).expanduser()
    sim = sim_root if sim_root is not None else os.environ.get("GPUSLATE_SIM")
    if sim:
        # a simulated run never writes to the user's real audit log
        root = Path(sim).absolute()
        if not (root / "host.json").is_file():
            from ..errors import BackendUnavailable

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
