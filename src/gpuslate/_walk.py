"""The trusted-root walk: how gpuslate opens every path it did not create in this run.

State files decide what gpuslate signals and record what it did, a simulated
host's files what it believes the GPUs hold, a remote ``install`` prefix where
a launcher root will run goes: so such a path is never handed to the kernel
whole: :func:`open_dir` walks it from ``/``
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

Which rule each path follows (docs/clear.md, "Paths gpuslate opens", lists them all): the state
folder ``PRIVATE`` (:mod:`gpuslate.host.statedir`), the lock folder ``SHARED``
(:mod:`gpuslate.host.lock`), a simulated host ``SHARED`` (:mod:`gpuslate.gpu.simhost.host`),
an ``install`` prefix ``PRIVATE`` on the host (:mod:`gpuslate.remote.zipapp`), and
a file or folder named on the command line ``SHARED`` (:func:`read_file`).

In both, only regular files and folders are accepted: a FIFO, a socket or a
device is refused (:class:`PermissionDenied`) before it is opened, and again
if one was swapped in meanwhile (``O_NONBLOCK``: opening a FIFO never hangs).
Folders gpuslate creates are 0700 (shared lock folders 1777), files 0600
(0644 where other users must read them, as the lock's holder file), whatever
the umask. Every read is bounded (:meth:`StateDir.read`: a file larger than
its limit is refused after ``limit + 1`` bytes, never read whole).
"""

from __future__ import annotations

import errno
import os
import stat
from enum import Enum
from pathlib import Path

from .errors import FileTooLarge, PermissionDenied, UsageError

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

    def __init__(self, fd: int, path: Path, *, trust: Trust, uid: int, what: str, hint: str | None = None) -> None:
        self.fd = fd
        self.path = path
        self.trust = trust
        self.uid = uid
        self.what = what
        self.hint = hint
        self.file_what = what.replace(" directory", "") + " file"  # "state file", "lock file"
        self._held = True

    def close(self) -> None:
        """Close the folder's descriptor (once; also when the object is collected)."""
        if self._held:
            self._held = False
            os.close(self.fd)

    def __del__(self) -> None:  # not weakref.finalize: its import is a cost of every simulated status
        try:
            self.close()
        except (AttributeError, OSError):  # half-built, or at interpreter exit
            pass

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
        if stat.S_ISREG(st.st_mode) and self.trust is Trust.SHARED and not writing:
            return  # the common case (a simulated host's records, read on every status): nothing to say
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
        """The bytes of file ``name``, ``None`` when it does not exist; one larger than ``limit``
        is refused (:class:`FileTooLarge`, a :class:`PermissionDenied`) after reading ``limit + 1``
        bytes, never more."""
        try:
            fd = self.open(name, os.O_RDONLY)
        except FileNotFoundError:
            return None
        with os.fdopen(fd, "rb") as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise FileTooLarge(f"refusing {self.file_what} {self.path / name}: larger than {limit} bytes")
        return data

    def create(self, name: str, flags: int = os.O_WRONLY, mode: int = 0o600) -> int | None:
        """Create file ``name`` exclusively (``mode`` exactly) and return its descriptor; ``None``
        when something already has that name (nothing of it is opened or followed)."""
        _check_name(name)
        try:
            fd = os.open(name, flags | os.O_CREAT | os.O_EXCL | FILE_FLAGS, mode, dir_fd=self.fd)
        except FileExistsError:
            return None
        os.fchmod(fd, mode)
        return fd

    def unlink(self, name: str) -> None:
        """Remove the entry ``name`` of this folder (a link is removed, never followed)."""
        _check_name(name)
        os.unlink(name, dir_fd=self.fd)

    def real_path(self) -> str:
        """Where this folder is, every link resolved, as /proc shows the files opened in it."""
        try:
            return os.readlink(f"/proc/self/fd/{self.fd}")
        except OSError:
            return os.path.realpath(self.path)

    def write_atomic(self, name: str, data: bytes, mode: int = 0o600, *, sync: bool = False) -> None:
        """Replace file ``name``: readers see the old content or the new, never half (``sync``: on
        disk before the rename, for a file that must survive a crash whole, as an installed program).

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
                if sync:
                    f.flush()
                    os.fsync(f.fileno())
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

    def names(self) -> list[str]:
        """Every name in the folder (unsorted, without ``.`` and ``..``)."""
        return os.listdir(self.fd)

    def lstat(self, name: str) -> os.stat_result:
        _check_name(name)
        return os.stat(name, dir_fd=self.fd, follow_symlinks=False)

    def subdir(self, name: str, *, create: bool = False, mode: int = 0o700) -> StateDir:
        """Folder ``name`` in this one, under the same rules (this folder's own checks done)."""
        _check_name(name)
        return _walk(self.path / name, [name], [(os.dup(self.fd), str(self.path), os.fstat(self.fd))],
                     trust=self.trust, uid=self.uid, what=self.what, create=create, mode=mode, parents_mode=mode,
                     hint=self.hint)


def open_dir(path: str | os.PathLike[str], *, trust: Trust = Trust.PRIVATE, create: bool = False,
             mode: int = 0o700, parents_mode: int = 0o700, uid: int | None = None,
             what: str = "state directory", hint: str | None = None,
             below: str | os.PathLike[str] | None = None) -> StateDir:
    """Walk ``path`` from ``/`` (a relative one from the working directory) under ``trust``'s rules
    and return the folder held open. With ``create``, missing folders are made: the last with
    ``mode``, those above with ``parents_mode`` (each exactly, whatever the umask).
    Raises :class:`PermissionDenied`, one line naming the component at fault (``what`` names the
    folder, ``hint`` says what to do; default: the state or lock folder's).

    ``below``: ``path`` is relative to this folder, which is reached under ``Trust.SHARED``
    rules (what is above it is not checked: the user's home on an automounted ``/home``) and is
    then itself the first folder ``trust`` checks."""
    uid = os.geteuid() if uid is None else uid
    path = _no_nul(Path(path), what)
    if below is not None:
        with open_dir(below, trust=Trust.SHARED, uid=uid, what=what, hint=hint) as base:
            start = (os.dup(base.fd), str(base.path), os.fstat(base.fd))
        parts = [p for p in path.parts if p not in ("", ".", "/")]
        return _walk(base.path.joinpath(*parts), parts, [start], trust=trust, uid=uid, what=what, create=create,
                     mode=mode, parents_mode=parents_mode, hint=hint)
    if not path.is_absolute():
        path = Path(os.getcwd(), path)  # '..' is left for the walk: it is not what the text says
    parts = [p for p in path.parts[1:] if p not in ("", ".")]
    root = os.open("/", _DIR_FLAGS)
    return _walk(path, parts, [(root, "/", os.fstat(root))], trust=trust, uid=uid, what=what,
                 create=create, mode=mode, parents_mode=parents_mode, hint=hint)


def open_file_dir(path: str | os.PathLike[str], *, trust: Trust = Trust.SHARED, uid: int | None = None,
                  what: str = "file", hint: str | None = None) -> tuple[StateDir, str]:
    """The folder of file ``path`` held open (walked as :func:`open_dir`) and the file's name in it.
    A symbolic link at the file itself is followed like one on the way: only when it is the
    invoking user's or root's (at most 40 links in all); what is left is a name to open in the
    folder (:meth:`StateDir.open`, :meth:`StateDir.read`), never through a link.
    ``what`` names the file in messages ("inventory", "unit file"...)."""
    uid = os.geteuid() if uid is None else uid
    path = _no_nul(Path(path), what)
    if not path.is_absolute():
        path = Path(os.getcwd(), path)
    shown = path
    for _ in range(_MAX_LINKS + 1):
        if path.name in ("", ".", ".."):
            raise PermissionDenied(f"refusing {what} {shown}: it names a folder, not a file")
        folder = open_dir(path.parent, trust=trust, uid=uid, what=f"{what} directory", hint=hint)
        try:
            st = os.stat(path.name, dir_fd=folder.fd, follow_symlinks=False)
        except FileNotFoundError:
            return folder, path.name  # the caller's open says it is missing, or creates it
        except OSError:
            folder.close()
            raise
        if not stat.S_ISLNK(st.st_mode):
            return folder, path.name
        if st.st_uid not in (uid, 0):
            folder.close()
            raise PermissionDenied(f"refusing {what} {shown}: {path} is a symbolic link owned by uid {st.st_uid}, "
                                   f"not by you (uid {uid}) or root", hint=hint)
        target = os.readlink(path.name, dir_fd=folder.fd)
        folder.close()
        path = Path(target) if target.startswith("/") else path.parent / target
    raise PermissionDenied(f"cannot use {what} {shown}: too many symbolic links")


def read_file(path: str | os.PathLike[str], *, limit: int, trust: Trust = Trust.SHARED, what: str = "file",
              hint: str | None = None) -> bytes:
    """The bytes of a file gpuslate was given (``--hosts FILE``, a unit file, a spec...), reached by
    :func:`open_file_dir` and read by :meth:`StateDir.read`: a regular file only (a FIFO never
    hangs the read, a device is never read), never through another user's link, at most ``limit``
    bytes. Raises ``FileNotFoundError``, :class:`PermissionDenied`, or the ``OSError`` the kernel gives."""
    folder, name = open_file_dir(path, trust=trust, what=what, hint=hint)
    with folder:
        data = folder.read(name, limit)
    if data is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
    return data


def write_file(path: str | os.PathLike[str], data: bytes, mode: int = 0o644, *, sync: bool = False,
               what: str = "output directory") -> None:
    """Write a file gpuslate was told to write (``--out``, an experiment's folder): its folder walked
    under ``Trust.SHARED`` rules and created 0755 where missing (never through another user's link),
    the file replaced atomically (:meth:`StateDir.write_atomic`: a link at its name is replaced,
    never followed)."""
    path = Path(path).absolute()
    with open_dir(path.parent, trust=Trust.SHARED, create=True, mode=0o755, parents_mode=0o755, what=what) as d:
        d.write_atomic(path.name, data, mode, sync=sync)


def _walk(path: Path, parts: list[str], stack: list[tuple[int, str, os.stat_result]], *, trust: Trust, uid: int,
          what: str, create: bool, mode: int, parents_mode: int, hint: str | None = None) -> StateDir:
    """Follow ``parts`` from the folder on top of ``stack`` (descriptor, path as text, stat), checking each
    step; ``..`` goes back up the folders actually walked, a trusted link's target is walked in its place.
    (Paths on the stack are plain strings: a status walks a few folders on every call.)"""
    links = retries = 0
    todo = list(reversed(parts))
    hint = hint if hint is not None else _hint(trust)

    def restart(at: str) -> None:
        """Walk on from ``/`` through ``at`` (an absolute link's target, or the folder a subdir() walk
        started in, to go above it): the stack then holds every folder from the root."""
        for fd, _, _ in stack:
            os.close(fd)
        stack.clear()
        root = os.open("/", _DIR_FLAGS)
        stack.append((root, "/", os.fstat(root)))
        todo.extend(reversed([p for p in at.split("/") if p not in ("", ".")]))

    def again(name: str) -> None:
        """Look at ``name`` once more (it changed under us), a bounded number of times."""
        nonlocal retries
        retries += 1
        if retries > _MAX_RETRIES:
            raise PermissionDenied(f"refusing {what} {path}: its folders keep changing while they are walked")
        todo.append(name)
    try:
        _check_dir(path, stack[-1][1], stack[-1][2], trust, uid, what, hint, final=not todo)
        while todo:
            name = todo.pop()
            final = not todo
            if name == "..":
                if len(stack) > 1:
                    os.close(stack.pop()[0])
                elif stack[0][1] != "/":  # above the folder a subdir() walk started in
                    todo.append("..")
                    restart(stack[0][1])
                    continue
                if final:
                    _check_dir(path, stack[-1][1], stack[-1][2], trust, uid, what, hint, final=True)
                continue
            parent_fd, parent_path, _ = stack[-1]
            here = parent_path + name if parent_path == "/" else f"{parent_path}/{name}"
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
                                           hint=hint) from None
                fd = _open_dir_at(path, parent_fd, name, here, what)
                st = os.fstat(fd)
                if st.st_uid == uid:
                    os.fchmod(fd, want)  # mkdir's mode went through the umask
                    st = os.fstat(fd)
                stack.append((fd, here, st))
                _check_dir(path, here, st, trust, uid, what, hint, final=final)
                continue
            except OSError as exc:
                raise PermissionDenied(f"cannot use {what} {path}: {here}: {exc.strerror or exc}",
                                       hint=hint) from None
            if stat.S_ISLNK(st.st_mode):
                if st.st_uid not in (uid, 0):
                    raise PermissionDenied(f"refusing {what} {path}: {here} is a symbolic link owned by uid "
                                           f"{st.st_uid}, not by you (uid {uid}) or root", hint=hint)
                links += 1
                if links > _MAX_LINKS:
                    raise PermissionDenied(f"cannot use {what} {path}: too many symbolic links")
                target = os.readlink(name, dir_fd=parent_fd)
                todo.extend(reversed([p for p in target.split("/") if p not in ("", ".")]))
                if target.startswith("/"):
                    restart("/")
                continue
            if not stat.S_ISDIR(st.st_mode):
                verb = "create" if create and not final else "use"
                tail = ("it exists and is not a directory" if final
                        else f"{here} is {_kind(st.st_mode)}, not a directory")
                raise PermissionDenied(f"cannot {verb} {what} {path}: {tail}", hint=hint)
            fd = _open_dir_at(path, parent_fd, name, here, what)
            after = os.fstat(fd)
            stack.append((fd, here, after))
            if (after.st_dev, after.st_ino) != (st.st_dev, st.st_ino):
                os.close(stack.pop()[0])
                again(name)  # swapped between the look and the open: look again
                continue
            _check_dir(path, here, after, trust, uid, what, hint, final=final)
        fd, _, _ = stack.pop()
        return StateDir(fd, path, trust=trust, uid=uid, what=what, hint=hint)
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def _open_dir_at(path: Path, parent_fd: int, name: str, here: str, what: str) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise PermissionDenied(f"refusing {what} {path}: {here} changed into something else while it was "
                                   "opened") from None
        raise PermissionDenied(f"cannot use {what} {path}: {here}: {exc.strerror or exc}") from None


def _check_dir(path: Path, here: str, st: os.stat_result, trust: Trust, uid: int, what: str, hint: str, *,
               final: bool) -> None:
    """A folder on the way (or the folder itself, ``final``) under ``trust``'s rules."""
    if trust is Trust.SHARED:
        return
    if st.st_uid not in (uid, 0):
        raise PermissionDenied(f"refusing {what} {path}: {here} is owned by uid {st.st_uid}, not by you "
                               f"(uid {uid}) or root", hint=hint)
    writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if writable and (final or not st.st_mode & stat.S_ISVTX):
        who = " and ".join(w for bit, w in ((stat.S_IWGRP, "group"), (stat.S_IWOTH, "others")) if writable & bit)
        fix = "set GPUSLATE_STATE_DIR to a private folder" if hint == _STATE_HINT else hint
        raise PermissionDenied(
            f"refusing {what} {path}: {here} is writable by {who} (mode {stat.S_IMODE(st.st_mode):o})",
            hint=f"chmod go-w {here}, or {fix}")


def _no_nul(path: Path, what: str) -> Path:
    """``path``, unless it holds a NUL byte, which no path can (the kernel would never see what follows
    it): bad input, said in one line, as every other path gpuslate is given is checked."""
    if "\0" in str(path):
        raise UsageError(f"invalid {what} path {str(path)!r}: a path cannot hold a NUL byte")
    return path


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
