"""Clear runs and signals by outcome, counted from the audit log as it grows.

The audit log (:mod:`gpuslate.host.audit`) is append-only JSON lines: a
``signal`` line before each signal, an ``outcome`` line after it. A scrape
reads only what was appended since the last one (the offset is remembered;
the whole file is never parsed again), at most :data:`MAX_READ` bytes at a
time so that a first scrape of a large log stays bounded (later scrapes catch
up). A line still being written (no newline yet) waits for the next scrape.
A file replaced or truncated (another inode, shorter than the offset, or other
first bytes: an inode number can be reused) is counted again from its start, as
a counter reset, which Prometheus expects.

The counts are monotonic, as Prometheus counters must be: a signal is counted
when its line appears, its outcome when the outcome line appears (a signal of
a run killed in between never gets one: ``signals - outcomes``).
"""

from __future__ import annotations

import json
import os
import stat
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import PermissionDenied
from ..host.statedir import open_dir
from .model import label

#: the most bytes one scrape reads from the log
MAX_READ = 8 * 1024 * 1024
#: a line longer than this is no audit entry: dropped without parsing
MAX_LINE = 1024 * 1024
#: how many of the file's first bytes identify it (entry ids are random)
HEAD = 256
#: signals awaiting their outcome line that are remembered (the oldest are forgotten first)
MAX_PENDING = 100_000


class AuditCounts:
    """What the log said so far (every field monotonic until a reset)."""

    def __init__(self) -> None:
        self.clear_runs: set[str] = set()
        self.signals: Counter[tuple[str, str]] = Counter()  # (action, signal)
        self.outcomes: Counter[tuple[str, str, str]] = Counter()  # (action, signal, outcome)
        self.unit_stops: dict[tuple[str, str], set[str]] = {}  # (unit, action) -> run ids
        self.pending: dict[str, tuple[str, str]] = {}  # entry id -> (action, signal)


class AuditTail:
    """Incremental counts of one audit log; ``where`` picks the entries of this host's backend."""

    def __init__(self, path: Path, where: Callable[[dict[str, Any]], bool]) -> None:
        self.path = path
        self.where = where
        self.counts = AuditCounts()
        self._file: tuple[int, int] | None = None  # (st_dev, st_ino) of the file read so far
        self._offset = 0
        self._partial = b""
        self._head = b""  # the file's first bytes: another file under a reused inode differs there

    def update(self) -> None:
        """Read what was appended since the last call; a missing log counts nothing.

        Raises :class:`PermissionDenied` when the log is a symbolic link or not a regular file.
        """
        try:  # the folder walked from / as every state path is; never a link, never blocking on a FIFO
            with open_dir(self.path.parent) as folder:
                fd = folder.open(self.path.name, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise PermissionDenied(f"cannot read the audit log {self.path}: {exc.strerror or exc}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise PermissionDenied(f"the audit log {self.path} is not a regular file")
            if (self._file != (st.st_dev, st.st_ino) or st.st_size < self._offset
                    or os.pread(fd, len(self._head), 0) != self._head):
                self._reset((st.st_dev, st.st_ino))
            if len(self._head) < HEAD:  # appends never change it; a short file's grows
                self._head = os.pread(fd, HEAD, 0)
            data = os.pread(fd, min(st.st_size - self._offset, MAX_READ), self._offset) \
                if st.st_size > self._offset else b""
        finally:
            os.close(fd)
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > MAX_LINE:
            self._partial = b""  # garbage without an end: never an entry (its end is dropped as torn)
        for line in lines:
            if line and len(line) <= MAX_LINE:
                self._take(line)

    def _reset(self, file: tuple[int, int]) -> None:
        self.counts = AuditCounts()
        self._file = file
        self._offset = 0
        self._partial = b""
        self._head = b""

    def _take(self, line: bytes) -> None:
        try:
            doc = json.loads(line)
        except ValueError:  # a torn line from a writer that crashed
            return
        if not isinstance(doc, dict) or not isinstance(doc.get("id"), str):
            return
        c = self.counts
        event = doc.get("event")
        if event == "signal" and self.where(doc):
            action, sig = label(str(doc.get("action"))), label(str(doc.get("signal")))
            c.signals[action, sig] += 1
            c.pending[doc["id"]] = (action, sig)
            if len(c.pending) > MAX_PENDING:
                del c.pending[next(iter(c.pending))]
            run = str(doc.get("run_id"))
            if action == "clear":
                c.clear_runs.add(run)
            target = doc.get("target")
            if isinstance(target, dict) and target.get("unit") is not None:
                c.unit_stops.setdefault((label(str(target["unit"])), action), set()).add(run)
        elif event == "outcome":
            key = c.pending.pop(doc["id"], None)
            if key is not None:  # a signal of this host; only its first outcome counts
                counted = (*key, label(str(doc.get("outcome"))))
                c.outcomes[counted] += 1
