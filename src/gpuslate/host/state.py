"""Where gpuslate keeps per-user state (the audit log, unit records), and how any state path is opened.

State files decide what gpuslate signals and record what it did, so a path to
one is never handed to the kernel whole: :func:`open_dir` walks it from ``/``
one component at a time (``openat`` with ``O_NOFOLLOW | O_NONBLOCK |
O_CLOEXEC``), looks at each component (``fstatat``) before opening it and at
the descriptor after (``fstat``), and files are then opened relative to the
folder's descriptor (:class:`StateDir`). The *unresolved* path is what is
checked: a symbolic link anywhere on it is a component like any other.

The rules, like OpenSSH's ``StrictModes`` but decided once here:

``Trust.PRIVATE`` (the state folder, its ``units`` and ``logs``)
    every component from ``/`` down, symbolic links included, is owned by the
    invoking user or root; a folder passed through is writable by nobody else,
    unless it is sticky (``/tmp``: others cannot rename or remove what we or
    root own in it); the state folder itself is writable by nobody else,
    sticky or not. Otherwise another user could swap a folder on the way and
    hand a root ``clear`` their own unit records, or make it write its audit
    log where they choose. Root's state for another user's simulated host is
    therefore refused (set ``GPUSLATE_STATE_DIR``).
``Trust.SHARED`` (the host lock folder, every user's by design)
    folders may be anyone's, but a symbolic link is followed only when it is
    owned by the invoking user or root (one that another user planted, e.g.
    ``SIMDIR/locks`` or ``/tmp/gpuslate-locks``, is refused); a file is
    written only when it is ours and has one link.

In both, only regular files and folders are accepted: a FIFO, a socket or a
device is refused (:class:`PermissionDenied`) before it is opened, and again
if one was swapped in meanwhile (``O_NONBLOCK``: opening a FIFO never hangs).
Folders gpuslate creates are 0700 (shared lock folders 1777), files 0600
(0644 where other users must read them, as the lock's holder file), whatever
the umask.
"""

from __future__ import annotations

import errno
import os
import stat
import weakref
from enum import Enum
from pathlib import Path

from ..errors import BackendUnavailable, PermissionDenied, UsageError

#: flags for every state file: never through a symlink, never blocking (a FIFO), never inherited by a child
FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_MAX_LINKS = 40  # symbolic links followed in one walk, as the kernel's MAXSYMLINKS
_MAX_RETRIES = 8  # components that changed between a look and an open, per walk: then it is an attack
_STATE_HINT = "use a folder of your own: set GPUSLATE_STATE_DIR"


class Trust(Enum):
    """Which rules a walk applies (see the module docstring)."""

    PRIVATE = "private"
    SHARED = "shared"


class StateDir:
    """A folder reached by a checked walk, held open: names in it are opened relative to its descriptor,
    so what was checked is what is used, whatever is renamed meanwhile.

    ``what`` names the folder in messages (``state directory``, ``lock directory``).
    """

    def __init__(self, fd: int, path: Path, *, trust: Trust, uid: int, what: str) -> None:
        self.fd = fd
        self.path = path
        self.trust = trust
        self.uid = uid
        self.what = what
        self.file_what = what.replace(" directory", "") + " file"  # "state file", "lock file"
        self._close = weakref.finalize(self, os.close, fd)

    def close(self) -> None:
        self._close()

    def __enter__(self) -> StateDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- files -------------------------------------------------------------------

    def open(self, name: str, flags: int, mode: int = 0o600) -> int:
        """``openat`` of the regular file ``name`` in this folder; with ``O_CREAT``, created
        (exclusively, then ``fchmod`` to ``mode``) when missing. Raises :class:`PermissionDenied`
        for anything that is not a regular file we may use, ``FileNotFoundError`` when missing
        without ``O_CREAT``, and other ``OSError`` as the kernel says."""
        _check_name(name)
        create = bool(flags & os.O_CREAT)
        flags &= ~(os.O_CREAT | os.O_EXCL)
        writing = bool(flags & (os.O_WRONLY | os.O_RDWR))
        for _ in range(3):
            try:
                before = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    fd = os.open(name, flags | os.O_CREAT | os.O_EXCL | FILE_FLAGS, mode, dir_fd=self.fd)
                except FileExistsError:
                    continue  # someone made it first: look at theirs
                os.fchmod(fd, mode)  # the umask decides nothing here
                return fd
            self._check_file(name, before, writing)
            try:
                fd = os.open(name, flags | FILE_FLAGS, dir_fd=self.fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENXIO, errno.ENOENT):
                    continue  # swapped meanwhile (a symlink, a FIFO without reader, gone): look again
                raise
            after = os.fstat(fd)
            if (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino):
                os.close(fd)
                continue
            try:
                self._check_file(name, after, writing)  # the file itself, as it is now
            except PermissionDenied:
                os.close(fd)
                raise
            return fd
        raise PermissionDenied(f"refusing {self.file_what} {self.path / name}: it keeps changing while opened")

    def _check_file(self, name: str, st: os.stat_result, writing: bool) -> None:
        where = f"{self.file_what} {self.path / name}"
        if not stat.S_ISREG(st.st_mode):
            raise PermissionDenied(f"refusing {where}: it is {_kind(st.st_mode)}, not a regular file")
        if self.trust is Trust.PRIVATE and st.st_uid not in (self.uid, 0):
            raise PermissionDenied(f"refusing {where}: it is owned by uid {st.st_uid}, not by you (uid {self.uid}) "
                                   "or root")
        if writing and self.trust is Trust.SHARED and st.st_uid != self.uid:
            raise PermissionDenied(f"refusing to write {where}: it is owned by uid {st.st_uid}, not by you")
        if writing and st.st_nlink != 1:
            raise PermissionDenied(f"refusing to write {where}: it has {st.st_nlink} hard links")

    def read(self, name: str, limit: int = 1 << 20) -> bytes | None:
        """At most ``limit`` bytes of file ``name``; ``None`` when it does not exist."""
        try:
            fd = self.open(name, os.O_RDONLY)
        except FileNotFoundError:
            return None
        with os.fdopen(fd, "rb") as f:
            return f.read(limit)

    def write_atomic(self, name: str, data: bytes, mode: int = 0o600) -> None:
        """Replace file ``name``: readers see the old content or the new, never half.

        The temporary file is created exclusively (a planted file or link there is
        never written through); ``renameat`` replaces whatever is at ``name``
        (a symbolic link included) rather than following it.
        """
        _check_name(name)
        tmp = f".{name}.{os.getpid()}.tmp"
        try:
            os.unlink(tmp, dir_fd=self.fd)  # a leftover of a crashed run with our pid
        except FileNotFoundError:
            pass
        fd = self.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=self.fd)
            except OSError:
                pass
            raise

    def rename(self, old: str, new: str) -> None:
        _check_name(old)
        _check_name(new)
        os.replace(old, new, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def remove(self, name: str) -> None:
        """Unlink ``name`` in this folder (a symbolic link itself, never what it points to);
        ``FileNotFoundError`` when it is not there."""
        _check_name(name)
        os.unlink(name, dir_fd=self.fd)

    def names(self) -> list[str]:
        """Every name in the folder (unsorted, without ``.`` and ``..``)."""
        return os.listdir(self.fd)

    def lstat(self, name: str) -> os.stat_result:
        _check_name(name)
        return os.stat(name, dir_fd=self.fd, follow_symlinks=False)

    def subdir(self, name: str, *, create: bool = False, mode: int = 0o700) -> StateDir:
        """Folder ``name`` in this one, under the same rules (this folder's own checks done)."""
        _check_name(name)
        return _walk(self.path / name, [name], [(os.dup(self.fd), self.path, os.fstat(self.fd))],
                     trust=self.trust, uid=self.uid, what=self.what, create=create, mode=mode, parents_mode=mode)


def open_dir(path: str | os.PathLike[str], *, trust: Trust = Trust.PRIVATE, create: bool = False,
             mode: int = 0o700, parents_mode: int = 0o700, uid: int | None = None,
             what: str = "state directory") -> StateDir:
    """Walk ``path`` from ``/`` (a relative one from the working directory) under ``trust``'s rules
    and return the folder held open. With ``create``, missing folders are made: the last with
    ``mode``, those above with ``parents_mode`` (each exactly, whatever the umask).
    Raises :class:`PermissionDenied`, one line naming the component at fault."""
    uid = os.geteuid() if uid is None else uid
    path = Path(path)
    if not path.is_absolute():
        path = Path(os.getcwd(), path)  # '..' is left for the walk: it is not what the text says
    parts = [p for p in path.parts[1:] if p not in ("", ".")]
    root = os.open("/", _DIR_FLAGS)
    return _walk(path, parts, [(root, Path("/"), os.fstat(root))], trust=trust, uid=uid, what=what,
                 create=create, mode=mode, parents_mode=parents_mode)


def _walk(path: Path, parts: list[str], stack: list[tuple[int, Path, os.stat_result]], *, trust: Trust, uid: int,
          what: str, create: bool, mode: int, parents_mode: int) -> StateDir:
    """Follow ``parts`` from the folder on top of ``stack`` (descriptor, path, stat), checking each step;
    ``..`` goes back up the folders actually walked, a trusted link's target is walked in its place."""
    links = retries = 0
    todo = list(reversed(parts))

    def again(name: str) -> None:
        """Look at ``name`` once more (it changed under us), a bounded number of times."""
        nonlocal retries
        retries += 1
        if retries > _MAX_RETRIES:
            raise PermissionDenied(f"refusing {what} {path}: its folders keep changing while they are walked")
        todo.append(name)
    try:
        _check_dir(path, stack[-1][1], stack[-1][2], trust, uid, what, final=not todo)
        while todo:
            name = todo.pop()
            final = not todo
            if name == "..":
                if len(stack) > 1:
                    os.close(stack.pop()[0])
                if final:
                    _check_dir(path, stack[-1][1], stack[-1][2], trust, uid, what, final=True)
                continue
            parent_fd, parent_path, _ = stack[-1]
            here = parent_path / name
            try:
                st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
            except FileNotFoundError:
                if not create:
                    raise FileNotFoundError(errno.ENOENT, f"{what} {path}: {here} does not exist", str(here)) from None
                want = mode if final else parents_mode
                try:
                    os.mkdir(name, want, dir_fd=parent_fd)
                except FileExistsError:
                    again(name)  # made meanwhile by someone else: look at it as it is
                    continue
                except OSError as exc:
                    raise PermissionDenied(f"cannot create {what} {path}: {exc.strerror or exc}",
                                           hint=_hint(trust)) from None
                fd = _open_dir_at(path, parent_fd, name, here, what)
                st = os.fstat(fd)
                if st.st_uid == uid:
                    os.fchmod(fd, want)  # mkdir's mode went through the umask
                    st = os.fstat(fd)
                stack.append((fd, here, st))
                _check_dir(path, here, st, trust, uid, what, final=final)
                continue
            except OSError as exc:
                raise PermissionDenied(f"cannot use {what} {path}: {here}: {exc.strerror or exc}",
                                       hint=_hint(trust)) from None
            if stat.S_ISLNK(st.st_mode):
                if st.st_uid not in (uid, 0):
                    raise PermissionDenied(f"refusing {what} {path}: {here} is a symbolic link owned by uid "
                                           f"{st.st_uid}, not by you (uid {uid}) or root", hint=_hint(trust))
                links += 1
                if links > _MAX_LINKS:
                    raise PermissionDenied(f"cannot use {what} {path}: too many symbolic links")
                target = os.readlink(name, dir_fd=parent_fd)
                if target.startswith("/"):
                    while len(stack) > 1:
                        os.close(stack.pop()[0])
                todo.extend(reversed([p for p in target.split("/") if p not in ("", ".")]))
                continue
            if not stat.S_ISDIR(st.st_mode):
                verb = "create" if create and not final else "use"
                tail = ("it exists and is not a directory" if final
                        else f"{here} is {_kind(st.st_mode)}, not a directory")
                raise PermissionDenied(f"cannot {verb} {what} {path}: {tail}", hint=_hint(trust))
            fd = _open_dir_at(path, parent_fd, name, here, what)
            after = os.fstat(fd)
            stack.append((fd, here, after))
            if (after.st_dev, after.st_ino) != (st.st_dev, st.st_ino):
                os.close(stack.pop()[0])
                again(name)  # swapped between the look and the open: look again
                continue
            _check_dir(path, here, after, trust, uid, what, final=final)
        fd, _, _ = stack.pop()
        return StateDir(fd, path, trust=trust, uid=uid, what=what)
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def _open_dir_at(path: Path, parent_fd: int, name: str, here: Path, what: str) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise PermissionDenied(f"refusing {what} {path}: {here} changed into something else while it was "
                                   "opened") from None
        raise PermissionDenied(f"cannot use {what} {path}: {here}: {exc.strerror or exc}") from None


def _check_dir(path: Path, here: Path, st: os.stat_result, trust: Trust, uid: int, what: str, *, final: bool) -> None:
    """A folder on the way (or the folder itself, ``final``) under ``trust``'s rules."""
    if trust is Trust.SHARED:
        return
    if st.st_uid not in (uid, 0):
        raise PermissionDenied(f"refusing {what} {path}: {here} is owned by uid {st.st_uid}, not by you "
                               f"(uid {uid}) or root", hint=_STATE_HINT)
    writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if writable and (final or not st.st_mode & stat.S_ISVTX):
        who = " and ".join(w for bit, w in ((stat.S_IWGRP, "group"), (stat.S_IWOTH, "others")) if writable & bit)
        raise PermissionDenied(
            f"refusing {what} {path}: {here} is writable by {who} (mode {stat.S_IMODE(st.st_mode):o})",
            hint=f"chmod go-w {here}, or set GPUSLATE_STATE_DIR to a private folder")


def _check_name(name: str) -> None:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise PermissionDenied(f"refusing state file name {name!r}: not one file name")


def _kind(mode: int) -> str:
    for test, word in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISDIR, "a directory"), (stat.S_ISREG, "a regular file")):
        if test(mode):
            return word
    return "of an unknown type"


def _hint(trust: Trust) -> str:
    return _STATE_HINT if trust is Trust.PRIVATE else \
        "set GPUSLATE_LOCK_DIR to a directory every gpuslate user can write"


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
    sim = sim_root if sim_root is not None else os.environ.get("GPUSLATE_SIM")
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
