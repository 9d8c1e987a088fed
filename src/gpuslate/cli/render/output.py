"""Output that cannot crash the run: stdout or stderr closed, their reader gone, or a full disk.

``gpuslate status >&-`` starts with no stdout at all (Python's ``sys.stdout`` is
then ``None``), ``gpuslate status | head -1`` loses its reader half-way, and
``> /dev/full`` fails every write. C programs die of SIGPIPE in the second case;
Python ignores the signal and raises ``BrokenPipeError`` wherever the next write
happens, which used to be a traceback, or worse: an experiment that stopped its
servers and exited 0 as if it had finished. Here, one guard per stream
(installed by :func:`guard_streams` for the console script) catches every failed
write and decides by what the command does (:class:`Mode`):

``PRINT`` (status, ps, logs, audit, wait, bench, experiment report, a dry run, --help)
    stdout lost: the command stops at once and exits 141 (128 + SIGPIPE, what a
    shell reports for ``yes | head -1``), quietly; stderr lost: ignored.
``ACT`` (clear, up, down, restart, rm, swap, slurm, sim, exporter, install)
    nothing stops the work: what cannot be written is dropped, the command
    finishes (its audit log included) and exits with its own code.
``RUN`` (experiment run, demo: hours of servers and load)
    either stream lost stops the run like Ctrl-C (every server stopped and the
    GPUs verified, finished points kept) and it exits 141, with the
    ``--resume`` line on stderr when stderr still works.

A stream is lost once: the first failed write is the only one that may raise
(:class:`OutputLost`, a ``KeyboardInterrupt`` so that the cleanup paths written
for Ctrl-C run), every later one is dropped, and the descriptor is pointed at
``/dev/null`` so that nothing else (a buffered flush, a child process) fails on
it again. Only the main thread raises; another thread's failed write is dropped
and the main thread's next write to that stream raises.
"""

from __future__ import annotations

import argparse
import enum
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

#: 128 + SIGPIPE: what a shell reports for a program killed by a closed pipe
LOST_STATUS = 141


class Mode(enum.Enum):
    PRINT = "print"
    ACT = "act"
    RUN = "run"


def mode_of(declared: Mode, args: argparse.Namespace) -> Mode:
    """The mode a command runs in: what its row in the command table declares (cli/commands/__init__.py),
    except that a dry run only prints, and so does a RUN command's verb other than ``run``
    (``experiment report``)."""
    if getattr(args, "dry_run", False):
        return Mode.PRINT
    if declared is Mode.RUN and getattr(args, "verb", "run") != "run":
        return Mode.PRINT
    return declared


class OutputLost(KeyboardInterrupt):
    """stdout or stderr could not be written: raised once, where the mode says the command stops."""

    def __init__(self, stream: str, why: str) -> None:
        super().__init__(f"{stream} {why}")
        self.stream = stream
        self.why = why


class _State:
    mode = Mode.PRINT
    quiet = 0  # > 0: inside quietly(): never raise
    raised = False  # OutputLost was raised once: never again (stdout and stderr are often one pipe, and
    # a second raise from the other stream would cut short the cleanup the first one started)
    guarded: list[GuardedStream] = []


def set_mode(mode: Mode) -> None:
    """The mode of the command about to run (``PRINT`` until then: parsing, --help); it may raise
    :class:`OutputLost` once again."""
    _State.mode = mode
    _State.raised = False


@contextmanager
def quietly() -> Iterator[None]:
    """Writes in the block never raise (an error being reported must not turn into another)."""
    _State.quiet += 1
    try:
        yield
    finally:
        _State.quiet -= 1


def _why(exc: BaseException | None) -> str:
    if exc is None:
        return "was closed before gpuslate started"
    if isinstance(exc, BrokenPipeError):
        return "has no reader any more (broken pipe)"
    if isinstance(exc, OSError) and exc.strerror:
        return f"cannot be written: {exc.strerror}"
    return "cannot be written"


class GuardedStream:
    """A text stream whose failed writes are handled as the module docstring says."""

    def __init__(self, stream: IO[str] | None, name: str) -> None:
        self._stream = stream
        self.name = name  # "stdout", "stderr"
        self.lost: str | None = None  # why, once lost

    def write(self, text: str) -> int:
        stream = self._stream
        if stream is None:
            self._lose(None)
            return len(text)
        try:
            return stream.write(text)
        except (OSError, ValueError) as exc:
            self._lose(exc)
            return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        stream = self._stream
        if stream is None:
            return
        try:
            stream.flush()
        except (OSError, ValueError) as exc:
            self._lose(exc)

    def isatty(self) -> bool:
        try:
            return self._stream is not None and self._stream.isatty()
        except (OSError, ValueError):
            return False

    def __getattr__(self, name: str) -> Any:  # encoding, errors, fileno, buffer...: a lost stream's are /dev/null's
        return getattr(self._stream if self._stream is not None else _null(), name)

    def _lose(self, exc: BaseException | None) -> None:
        if self.lost is None:
            self.lost = _why(exc)
            old, self._stream = self._stream, None
            _to_devnull(old)
        if _State.raised or _State.quiet or threading.current_thread() is not threading.main_thread():
            return
        if _State.mode is Mode.RUN or (_State.mode is Mode.PRINT and self.name == "stdout"):
            _State.raised = True
            raise OutputLost(self.name, self.lost)


_NULL: list[IO[str]] = []


def _null() -> IO[str]:
    """/dev/null as a text stream (opened once): what a lost stream's attributes come from."""
    if not _NULL:
        _NULL.append(open(os.devnull, "w", encoding="utf-8"))  # kept for the process's life
    return _NULL[0]


def _to_devnull(stream: IO[str] | None) -> None:
    """Point the stream's descriptor (1 or 2) at /dev/null: its buffered bytes, a later flush and
    the children that inherit it then fail on nothing. Other streams (a test's capture) are left."""
    if stream is None:
        return
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):
        return
    if fd not in (1, 2):
        return
    try:
        null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.dup2(null, fd)  # the new descriptor is inheritable: children get /dev/null, not a closed fd
    finally:
        os.close(null)
    try:
        stream.flush()  # what was buffered goes to /dev/null
    except (OSError, ValueError):
        pass


def open_standard_fds() -> None:
    """Descriptors 0, 1 and 2 that were closed before gpuslate started are opened on /dev/null:
    otherwise the next file gpuslate opens would become 'stdout', and a server it starts would
    write its output into it. A closed stdin reads as an empty one (a question is answered no)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            try:
                null = os.open(os.devnull, os.O_RDWR)
            except OSError:
                continue
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    if sys.stdin is None:  # Python saw fd 0 closed at its start: reading it now gives an end of file
        sys.stdin = os.fdopen(0, "r", closefd=False)


def guard_streams() -> None:
    """Replace ``sys.stdout`` and ``sys.stderr`` by guarded streams (once; a closed one,
    ``None``, becomes a stream that is lost at its first write)."""
    if isinstance(sys.stdout, GuardedStream):
        return
    out, err = GuardedStream(sys.stdout, "stdout"), GuardedStream(sys.stderr, "stderr")
    _State.guarded = [out, err]
    sys.stdout, sys.stderr = out, err


def lost() -> list[str]:
    """What was lost so far: ``"stdout has no reader any more (broken pipe)"``..."""
    return [f"{s.name} {s.lost}" for s in _State.guarded if s.lost is not None]
