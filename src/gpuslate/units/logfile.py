"""Per-unit log files: rotated at every start, read from the end, followed across rotations,
and the time each line was written.

A unit's stdout and stderr go into a pipe read by a *log relay*: a small process (``python -I -S``,
the standard library only, titled ``gpuslate-logs``) that appends what it reads to ``NAME.log`` at
once, as the server wrote it, and the time each line began to ``NAME.log.times`` (a 16-byte
record per line: its offset in the log and the epoch time, never going backwards), which is what
``logs --timestamps`` and ``logs --since`` read. Like docker's containerd-shim, the relay is not
part of the unit: it is started before the server, in a session of its own, ignores the signals a
terminal or ``down`` sends, holds no GPU, and leaves when the last process holding the pipe has
(end of file); no gpuslate process has to stay alive for logging. A running unit's file is not cut
while it runs; it is rotated when the unit is started again (``NAME.log`` -> ``NAME.log.1`` ...
``NAME.log.KEEP``, each with its ``.times``). Where the relay cannot be started, the server writes
into the log itself, as it did before there was a relay, and its lines have no times.

The ``logs`` verb (:class:`UnitLog`, ``Host.logs()``) finds a unit's log by its record and reads
it as a :class:`LogsResult` (the ``gpuslate.logs.v1`` document); ``logs --follow`` goes on from
where that snapshot stopped (:meth:`UnitLog.follow_on`).

Log files are state files: every one is opened through the checked state folder
(:func:`gpuslate.host.statedir.open_dir`), never through a symbolic link, and a FIFO
or anything else that is not a regular file is refused, not waited on.
"""

from __future__ import annotations

import bisect
import os
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NamedTuple

from .._document import Fields, Malformed, checked, iso, reading
from .._time import iso_time_us, parse_iso_time
from ..errors import UsageError
from ..host.statedir import StateDir, open_dir
from ..options import LogsOptions
from . import store
from .unit import Unit

if TYPE_CHECKING:
    from ..host.session import HostContext
from ..outcome import Outcome, StatusEnum

KEEP = 5
SCHEMA = "gpuslate.logs.v1"
TIMES = ".times"  # NAME.log -> NAME.log.times, NAME.log.1 -> NAME.log.1.times
_RECORD = struct.Struct("<Qd")  # (offset of a line's first byte, epoch time it was read)
_TIMES_LIMIT = 64 << 20  # bytes of an index read at once (4 million lines)

#: the relay (see the module docstring), run as ``python -I -S -c _RELAY_BOOT TIMES_FD`` with the
#: program in its environment: stdin the unit's pipe, stdout the log (O_APPEND), TIMES_FD the index
_RELAY_VAR = "GPUSLATE_LOG_RELAY"
_RELAY_BOOT = f"import os; exec(os.environ.pop({_RELAY_VAR!r}))"
RELAY = r"""
import os, signal, struct, sys, time
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGTSTP):
    signal.signal(s, signal.SIG_IGN)
try:
    with open("/proc/self/comm", "w") as f:
        f.write("gpuslate-logs")
except OSError:
    pass
times, rec, start, last = int(sys.argv[1]), struct.Struct("<Qd").pack, True, 0.0
def put(fd, data):
    while data:
        try:
            data = data[os.write(fd, data):]
        except InterruptedError:
            continue
        except OSError:
            return
while True:
    try:
        chunk = os.read(0, 1 << 16)
    except InterruptedError:
        continue
    except OSError:
        break
    if not chunk:
        break
    last = now = max(time.time(), last)
    try:
        pos = os.fstat(1).st_size
    except OSError:
        pos = 0
    marks = [rec(pos, now)] if start else []
    i = chunk.find(b"\n")
    while 0 <= i < len(chunk) - 1:
        marks.append(rec(pos + i + 1, now))
        i = chunk.find(b"\n", i + 1)
    start = chunk.endswith(b"\n")
    put(times, b"".join(marks))
    put(1, chunk)
"""


class LogsStatus(StatusEnum):
    SHOWN = "shown", Outcome.DONE  # the lines (none, for a unit that never wrote or has no log yet)


class LogsResult(NamedTuple):
    """``gpuslate logs NAME`` (a snapshot: ``--follow`` goes on after it): the unit's last lines."""

    name: str
    log: str  # the log file
    exists: bool
    running: bool
    tail: int | None  # the lines asked for; None: all
    lines: list[str]
    since: float | None = None  # --since: only lines written at or after this epoch time
    times: list[float | None] | None = None  # --timestamps: when each line was written (None: not recorded)

    @property
    def status(self) -> LogsStatus:
        return LogsStatus.SHOWN

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "name": self.name, "log": self.log, "exists": self.exists,
                "running": self.running, "tail": self.tail,
                "since": iso_time_us(self.since) if self.since is not None else None, "lines": self.lines,
                "times": None if self.times is None else
                [iso_time_us(x) if x is not None else None for x in self.times]}

    @classmethod
    def from_json(cls, doc: object) -> LogsResult:
        f = Fields(checked(doc, SCHEMA))
        with reading(SCHEMA):
            lines = f.texts("lines")
            # since, times: absent in documents from before them
            times = (None if f.raw("times", None) is None
                     else f.items("times", lambda x: None if x is None else iso(x)))
            if times is not None and len(times) != len(lines):
                raise Malformed("times: expected one time (or null) per line")
            return cls(f.text("name"), f.text("log"), f.flag("exists"), f.flag("running"),
                       f.opt_integer("tail", 0, what="a number of lines"), lines, f.opt_time("since", default=None),
                       times)


def _time_of(text: object) -> float:
    if not isinstance(text, str) or not parse_iso_time(text):
        raise ValueError(f"expected a UTC time, got {text!r}")
    return parse_iso_time(text)


_BLOCK = 64 * 1024


def times_path(log: Path) -> Path:
    return log.with_name(log.name + TIMES)


def rotate(path: Path, keep: int = KEEP) -> None:
    with open_dir(path.parent, create=True) as folder:
        _rotate(folder, path.name, keep)


def _rotate(folder: StateDir, name: str, keep: int) -> None:
    names = set(folder.names())
    if name not in names:
        return
    for i in range(keep - 1, 0, -1):
        for old, new in ((f"{name}.{i}", f"{name}.{i + 1}"), (f"{name}.{i}{TIMES}", f"{name}.{i + 1}{TIMES}")):
            if old in names:
                folder.rename(old, new)
    folder.rename(name, f"{name}.1")
    if f"{name}{TIMES}" in names:
        folder.rename(f"{name}{TIMES}", f"{name}.1{TIMES}")


def open_for_unit(path: Path) -> tuple[int, int]:
    """A fresh log file for a new run of the unit, and its line-time index: two descriptors
    (``O_APPEND``), the older files rotated away."""
    with open_dir(path.parent, create=True) as folder:
        _rotate(folder, path.name, KEEP)
        log = folder.open(path.name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            times = folder.open(path.name + TIMES, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o600)
        except BaseException:
            os.close(log)
            raise
        return log, times


#: relays this process started, reaped as they end (a long-lived library caller leaves no zombies)
_relays: list[subprocess.Popen[bytes]] = []


def start_relay(log: int, times: int) -> tuple[subprocess.Popen[bytes], int] | None:
    """Start the log relay writing ``log`` and ``times``; (it, the pipe's write end for the unit's
    stdout and stderr), or None when it cannot be started (the unit then writes ``log`` itself)."""
    _relays[:] = [r for r in _relays if r.poll() is None]
    read, write = os.pipe()
    try:
        # the program in the environment, not the command line: `ps` shows one short line
        relay = subprocess.Popen([sys.executable, "-I", "-S", "-c", _RELAY_BOOT, str(times)], stdin=read,
                                 stdout=log, stderr=subprocess.DEVNULL, pass_fds=(times,), close_fds=True, cwd="/",
                                 env={"LC_ALL": "C", _RELAY_VAR: RELAY}, start_new_session=True)
    except OSError:
        os.close(write)
        return None
    finally:
        os.close(read)
    _relays.append(relay)
    return relay, write


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


class LineTimes:
    """A log's line-time index (``NAME.log.times``), read as far as it is written: the time of the
    line that starts at an offset, and the first line written at or after a time."""

    def __init__(self, log: Path) -> None:
        self.path = times_path(log)
        self.offsets: list[int] = []
        self.times: list[float] = []
        self.recorded = False  # whether the log has an index at all (one from before relays has none)
        self._read = 0

    def refresh(self) -> LineTimes:
        """Read what was appended since the last look (bounded: :data:`_TIMES_LIMIT` at a time)."""
        try:
            with open_dir(self.path.parent) as folder:
                fd = folder.open(self.path.name, os.O_RDONLY)
        except FileNotFoundError:
            return self
        self.recorded = True
        with os.fdopen(fd, "rb") as f:
            f.seek(self._read)
            data = f.read(_TIMES_LIMIT)
        whole = len(data) - len(data) % _RECORD.size
        for off, at in _RECORD.iter_unpack(data[:whole]):
            self.offsets.append(off)
            self.times.append(at)
        self._read += whole
        return self

    def at(self, offset: int) -> float | None:
        i = bisect.bisect_left(self.offsets, offset)
        return self.times[i] if i < len(self.offsets) and self.offsets[i] == offset else None

    def offset_since(self, since: float) -> int | None:
        """The offset of the first line written at or after ``since``; None: none was (yet)."""
        i = bisect.bisect_left(self.times, since)
        return self.offsets[i] if i < len(self.offsets) else None


class Lines(NamedTuple):
    """Lines read from a log: each with the offset of its first byte, and where reading stopped."""

    lines: list[tuple[int, str]]
    position: tuple[int, int] | None  # (inode, offset) for follow(); None without a file


def _split(data: bytes, base: int, whole_first: bool) -> list[tuple[int, str]]:
    """``data`` (read from offset ``base``) as lines with their offsets; a first piece that is not a
    whole line (``whole_first`` False) is dropped; a last piece without a newline is kept."""
    out: list[tuple[int, str]] = []
    if not data:
        return out
    pos = base
    pieces = data.split(b"\n")
    if data.endswith(b"\n"):
        pieces.pop()
    for k, piece in enumerate(pieces):
        if k or whole_first:
            out.append((pos, piece.removesuffix(b"\r").decode("utf-8", "replace")))
        pos += len(piece) + 1
    return out


def read_lines(path: Path, n: int | None = None, *, start: int = 0) -> Lines:
    """The lines from offset ``start`` (a line's first byte) to the end, only the last ``n`` of
    them when given (read backwards only as far as needed)."""
    try:
        f = _open_log(path)
    except FileNotFoundError:
        return Lines([], None)
    with f:
        ino = os.fstat(f.fileno()).st_ino
        end = f.seek(0, os.SEEK_END)
        if n is not None and n <= 0:
            return Lines([], (ino, end))
        if n is None:
            f.seek(start)
            data = f.read()
            return Lines(_split(data, start, True), (ino, start + len(data)))
        pos, data = end, b""
        while pos > start and data.count(b"\n") <= n:
            step = min(_BLOCK, pos - start)
            pos -= step
            f.seek(pos)
            data = f.read(step) + data
        return Lines(_split(data, pos, pos == start)[-n:], (ino, end))


def tail(path: Path, n: int | None) -> list[str]:
    """The last ``n`` lines (all when None), read backwards only as far as needed."""
    return [line for _, line in read_lines(path, n).lines]


def snapshot(path: Path, n: int | None = None, since: float | None = None,
             timestamps: bool = False) -> tuple[list[str], list[float | None] | None, tuple[int, int] | None, bool]:
    """What ``logs`` shows: the last ``n`` lines written at or after ``since`` (all: None), their times
    when ``timestamps``, where :func:`follow` goes on from, and whether the log has line times."""
    index = LineTimes(path).refresh() if since is not None or timestamps else None
    start = 0
    if index is not None and since is not None:
        found = index.offset_since(since)
        if found is None:  # nothing written since then: from the end on
            try:
                with _open_log(path) as f:
                    found = f.seek(0, os.SEEK_END)
            except FileNotFoundError:
                found = 0
        start = found
    got = read_lines(path, n, start=start)
    times = [index.at(off) for off, _ in got.lines] if index is not None and timestamps else None
    return [line for _, line in got.lines], times, got.position, bool(index and index.recorded)


def follow(path: Path, *, since: tuple[int, int] | None, keep_going: Callable[[], bool],
           interval: float = 0.1) -> Iterator[tuple[int, str]]:
    """Lines appended to ``path`` after ``since`` (from :func:`read_lines`) as they come (raw, with
    their newline), each with its offset, until ``keep_going()`` says stop and everything written
    so far was read. A new file at ``path`` (the unit was started again) is followed from its start."""
    f = None
    ino = None
    partial = b""
    pos = 0
    while True:
        if f is None:
            try:
                f = _open_log(path)
                ino = os.fstat(f.fileno()).st_ino
                pos = 0
                if since is not None and since[0] == ino:
                    pos = f.seek(since[1])
                since = None
            except FileNotFoundError:
                f = None
        chunk = f.read() if f is not None else b""
        if chunk:
            lines = (partial + chunk).split(b"\n")
            partial = lines.pop()
            for line in lines:
                yield pos, line.decode("utf-8", "replace") + "\n"
                pos += len(line) + 1
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
                yield pos, partial.decode("utf-8", "replace")
            if f is not None:
                f.close()
            return
        time.sleep(interval)


class UnitLog:
    """The ``logs`` verb: unit ``name``'s log on ``ctx``'s host, found by its record (an unknown
    unit is a :class:`~gpuslate.errors.UsageError`; a corrupt record: where its logs go), read
    as a snapshot (:meth:`read`) and followed on from there (:meth:`follow_on`)."""

    def __init__(self, ctx: HostContext, name: str) -> None:
        units = store.UnitStore.of(ctx)
        unit = Unit.load(units, name)
        if unit is None:
            raise UsageError(f"unknown unit {name!r}: see 'gpuslate ps'")
        self.name = name
        self.path = Path(unit.record.log) if unit.record else units.log_path(name)
        self._units, self._unit = units, unit
        self._position: tuple[int, int] | None = None
        self._timestamps = False

    def read(self, options: LogsOptions) -> LogsResult:
        """The snapshot ``options`` asks for (``--since`` on a log without line times: UsageError)."""
        if options.tail is not None and options.tail < 0:
            raise UsageError(f"invalid --tail {options.tail}: must be at least 0")
        lines, times, position, recorded = snapshot(self.path, options.tail, options.since, options.timestamps)
        if options.since is not None and not recorded and position is not None:
            raise UsageError(f"the log of {self.name} has no line times (written before gpuslate recorded them): "
                             "--since cannot tell which lines are newer", hint="use --tail N")
        self._position, self._timestamps = position, options.timestamps
        return LogsResult(self.name, str(self.path), position is not None, self._unit.running(), options.tail,
                          lines, options.since, times)

    def follow_on(self) -> Iterator[tuple[float | None, str]]:
        """The lines written after the last :meth:`read` as they come (raw, with their newline), each
        with the time it was written when that read asked for times (else, or not recorded: None),
        until the unit is gone (a restart is a new record: followed) and everything it wrote was read."""
        index = LineTimes(self.path) if self._timestamps else None

        def running() -> bool:
            return (Unit.load(self._units, self.name) or self._unit).running()

        for offset, line in follow(self.path, since=self._position, keep_going=running):
            at = None
            if index is not None:
                at = index.at(offset) if index.at(offset) is not None else index.refresh().at(offset)
            yield at, line


MANY_SCHEMA = "gpuslate.logs.many.v1"


class ManyLogs(NamedTuple):
    """``gpuslate logs A B`` and ``gpuslate logs`` (every unit): each unit's snapshot, read with its
    line times so that they can be shown interleaved by the time each line was written, prefixed with
    the unit's name, as ``docker compose logs`` shows services (:meth:`merged`). ``timestamps``:
    whether the times are shown (``--timestamps``)."""

    logs: list[LogsResult]
    timestamps: bool = False

    @property
    def status(self) -> LogsStatus:
        return LogsStatus.SHOWN

    def merged(self) -> list[tuple[str, float | None, str]]:
        """Every line as (unit, time, text), in the order they were written: by time, the lines of one
        unit in their order (a line whose time was not recorded goes with the line before it)."""
        keyed = []
        for i, log in enumerate(self.logs):
            last = float("-inf")
            for j, (line, at) in enumerate(zip(log.lines, log.times or [None] * len(log.lines))):
                last = at if at is not None else last
                keyed.append(((last, i, j), (log.name, at, line)))
        return [item for _, item in sorted(keyed, key=lambda kv: kv[0])]

    def to_json(self) -> dict[str, Any]:
        return {"schema": MANY_SCHEMA, "timestamps": self.timestamps, "logs": [log.to_json() for log in self.logs]}

    @classmethod
    def from_json(cls, doc: object) -> ManyLogs:
        f = Fields(checked(doc, MANY_SCHEMA))
        with reading(MANY_SCHEMA):
            return cls(f.items("logs", LogsResult.from_json), f.flag("timestamps"))


def unit_logs(ctx: HostContext, names: list[str]) -> list[UnitLog]:
    """The logs of units ``names`` (none: every unit with a record, as ``ps -a`` lists them), each found
    before any is read: an unknown unit is a :class:`~gpuslate.errors.UsageError`."""
    return [UnitLog(ctx, name) for name in (names or store.UnitStore.of(ctx).names())]


def read_many(logs: list[UnitLog], options: LogsOptions) -> ManyLogs:
    """Each unit's snapshot with its line times (to interleave them); ``options.timestamps``: shown."""
    timed = options._replace(timestamps=True)
    return ManyLogs([log.read(timed) for log in logs], options.timestamps)


def relay_done(relay: subprocess.Popen[bytes] | None, timeout: float = 2.0) -> None:
    """Wait (at most ``timeout``) until the relay has written what the unit wrote: it ends once every
    process of the unit is gone. A relay still held by a stray's copy of the pipe is left running."""
    if relay is None:
        return
    try:
        relay.wait(timeout)
    except subprocess.TimeoutExpired:
        pass
