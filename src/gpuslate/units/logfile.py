"""Per-unit log files: rotated at every start, read from the end, followed across rotations.

The unit writes straight into its file (stdout and stderr, ``O_APPEND``):
no gpuslate process has to stay alive to carry its output. The price is that
a running unit's file is not cut while it runs; it is rotated when the unit
is started again (``NAME.log`` -> ``NAME.log.1`` ... ``NAME.log.KEEP``).

Log files are state files: every one is opened through the checked state folder
(:func:`gpuslate.host.state.open_dir`), never through a symbolic link, and a FIFO
or anything else that is not a regular file is refused, not waited on.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from enum import Enum
from pathlib import Path
from typing import IO, Any, NamedTuple

from .._document import checked, reading
from ..host.state import StateDir, open_dir

KEEP = 5
SCHEMA = "gpuslate.logs.v1"


class LogsStatus(str, Enum):
    SHOWN = "shown"  # the lines (none, for a unit that never wrote or has no log yet)


class LogsResult(NamedTuple):
    """``gpuslate logs NAME`` (a snapshot: ``--follow`` goes on after it): the unit's last lines."""

    name: str
    log: str  # the log file
    exists: bool
    running: bool
    tail: int | None  # the lines asked for; None: all
    lines: list[str]

    @property
    def status(self) -> LogsStatus:
        return LogsStatus.SHOWN

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "name": self.name, "log": self.log, "exists": self.exists,
                "running": self.running, "tail": self.tail, "lines": self.lines}

    @classmethod
    def from_json(cls, doc: object) -> LogsResult:
        d = checked(doc, SCHEMA)
        with reading(SCHEMA):
            lines, tail = d["lines"], d["tail"]
            if not isinstance(lines, list) or not all(isinstance(ln, str) for ln in lines):
                raise TypeError("lines: expected a list of strings")
            if tail is not None and (isinstance(tail, bool) or not isinstance(tail, int)):
                raise TypeError(f"tail: expected a number of lines, got {tail!r}")
            return cls(str(d["name"]), str(d["log"]), bool(d["exists"]), bool(d["running"]), tail, list(lines))
_BLOCK = 64 * 1024


def rotate(path: Path, keep: int = KEEP) -> None:
    with open_dir(path.parent, create=True) as folder:
        _rotate(folder, path.name, keep)


def _rotate(folder: StateDir, name: str, keep: int) -> None:
    names = set(folder.names())
    if name not in names:
        return
    for i in range(keep - 1, 0, -1):
        if f"{name}.{i}" in names:
            folder.rename(f"{name}.{i}", f"{name}.{i + 1}")
    folder.rename(name, f"{name}.1")


def open_for_unit(path: Path) -> int:
    """A fresh log file for a new run of the unit; the descriptor the unit writes to."""
    with open_dir(path.parent, create=True) as folder:
        _rotate(folder, path.name, KEEP)
        return folder.open(path.name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)


def _open_log(path: Path) -> IO[bytes]:
    """The log for reading, through the checked folder (FileNotFoundError when there is none)."""
    with open_dir(path.parent) as folder:
        fd = folder.open(path.name, os.O_RDONLY)
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def _inode(path: Path) -> int | None:
    try:
        with open_dir(path.parent) as folder:
            return folder.lstat(path.name).st_ino
    except FileNotFoundError:
        return None


def tail(path: Path, n: int | None) -> list[str]:
    """The last ``n`` lines (all when None), read backwards only as far as needed."""
    return tail_at(path, n)[0]


def tail_at(path: Path, n: int | None) -> tuple[list[str], tuple[int, int] | None]:
    """:func:`tail`, and where it stopped reading ((inode, offset); None without a file),
    for :func:`follow` to go on from exactly there."""
    try:
        f = _open_log(path)
    except FileNotFoundError:
        return [], None
    with f:
        ino = os.fstat(f.fileno()).st_ino
        if n is None:
            data = f.read()
            return data.decode("utf-8", "replace").splitlines(), (ino, len(data))
        end = f.seek(0, os.SEEK_END)
        if n <= 0:
            return [], (ino, end)
        pos, data = end, b""
        while pos > 0 and data.count(b"\n") <= n:
            step = min(_BLOCK, pos)
            pos -= step
            f.seek(pos)
            data = f.read(step) + data
        return data.decode("utf-8", "replace").splitlines()[-n:], (ino, end)


def follow(path: Path, *, since: tuple[int, int] | None, keep_going: Callable[[], bool],
           interval: float = 0.1) -> Iterator[str]:
    """Lines appended to ``path`` after ``since`` (from :func:`tail_at`) as they come (raw,
    with their newline), until ``keep_going()`` says stop and everything written so far was
    read. A new file at ``path`` (the unit was started again) is followed from its start."""
    f = None
    ino = None
    partial = b""
    while True:
        if f is None:
            try:
                f = _open_log(path)
                ino = os.fstat(f.fileno()).st_ino
                if since is not None and since[0] == ino:
                    f.seek(since[1])
                since = None
            except FileNotFoundError:
                f = None
        chunk = f.read() if f is not None else b""
        if chunk:
            lines = (partial + chunk).split(b"\n")
            partial = lines.pop()
            for line in lines:
                yield line.decode("utf-8", "replace") + "\n"
            continue
        now = _inode(path) if f is not None else None
        rotated = f is not None and now is not None and now != ino
        if rotated:
            assert f is not None
            f.close()
            f, partial = None, b""
            continue
        if not keep_going():
            if partial:
                yield partial.decode("utf-8", "replace")
            if f is not None:
                f.close()
            return
        time.sleep(interval)
