"""The host context: one host, opened once, for one command.

Everything an operation needs from the host it runs on, owned in one place for
the length of one command: the GPU backend and what it can do (its memory API,
and so what an idle GPU's "used" memory looks like), the host lock (taken once
and re-entrant, so that a composite verb such as ``swap`` or ``up --clear``
calls its sibling verbs while holding it, with no ``lock=`` flag anywhere),
the audit log (opened on first use, its entries marked with this backend and
host), the state folder, and the event sinks: ``on_event`` for progress lines
(what happened: a signal sent, a phase begun), ``on_progress`` for a wait under
way (:class:`Progress`: what is waited for, for how long, its latest news), which a
terminal shows in place and nothing else needs (a library caller that passes none
pays nothing: the news is only made when there is a sink).

This is the *context* only. The verbs (``status``, ``clear``, ``wait``, ``up``,
``down``, ``swap``, ``ps``) are the methods of :class:`gpuslate.api.Host`, a
subclass that lives above ``clearing/`` and ``units/`` in the import graph: those
packages take a :class:`HostContext` and import this module, so the verbs
cannot live here without an import loop.

The lock, the audit log and the state folder are imported where they are first
used (three imports inside methods, on purpose): ``status`` only looks, takes no
lock and writes no log, and must not pay for their modules at every start.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from ..gpu import GpuBackend, open_backend

if TYPE_CHECKING:
    from .audit import AuditLog
    from .lock import HostLock

MiB = 1024**2
#: the default --max-used: an idle GPU counts as free on drivers with and without NVML's v2 memory
#: API. v2 drivers (R510+) report driver-reserved memory apart from 'used' (an idle GPU reads 0);
#: v1 drivers count it as used (645 MB on an H200).
DEFAULT_MAX_USED_V2 = 64 * MiB
DEFAULT_MAX_USED_V1 = 1024 * MiB

Note = Callable[[str], None]
_H = TypeVar("_H", bound="HostContext")

#: seconds between two reports of one wait to the progress sink
PROGRESS_INTERVAL_S = 0.25


class Progress(NamedTuple):
    """A wait under way: what is waited for (``task``), for how long so far and at most, and
    its latest news (``detail``: the server's last log line, the GPU memory still held; made of
    what processes wrote: escape it before it reaches a terminal). ``done``: the wait is over."""

    task: str
    elapsed_s: float
    limit_s: float | None
    detail: str = ""
    done: bool = False


ProgressSink = Callable[[Progress], None]


class Ticker:
    """Reports one wait to a progress sink, at most every :data:`PROGRESS_INTERVAL_S`, the
    detail made only then (``tick(lambda: ...)``); a last report with ``done`` when it ends.
    Without a sink it does nothing. A sink that fails is ignored, as for ``on_event``."""

    def __init__(self, sink: ProgressSink | None, task: str, limit_s: float | None, *,
                 started: float | None = None) -> None:
        self.sink = sink
        self.task = task
        self.limit_s = limit_s
        self.t0 = time.monotonic() if started is None else started
        self._last: float | None = None
        self._detail = ""

    def __call__(self, detail: Callable[[], str]) -> None:
        if self.sink is None:
            return
        now = time.monotonic()
        if self._last is not None and now - self._last < PROGRESS_INTERVAL_S:
            return
        self._last = now
        self._detail = detail()
        self._send(Progress(self.task, now - self.t0, self.limit_s, self._detail))

    def done(self) -> None:
        if self.sink is not None and self._last is not None:
            self._send(Progress(self.task, time.monotonic() - self.t0, self.limit_s, self._detail, True))

    def _send(self, p: Progress) -> None:
        try:
            self.sink(p)  # type: ignore[misc]
        except (OSError, ValueError):  # the terminal is gone: the wait goes on
            self.sink = None

    def __enter__(self) -> Ticker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.done()


def default_max_used(backend: GpuBackend) -> int:
    return DEFAULT_MAX_USED_V1 if getattr(backend, "memory_api", "v2") == "v1" else DEFAULT_MAX_USED_V2


def quiet(on_event: Note | None) -> Note:
    """``on_event`` that cannot fail: a progress line to a terminal that is gone (the ssh session
    dropped: EIO, a closed pipe) must not cut short a clear or the stop of a unit."""
    if on_event is None:
        return lambda _m: None
    report = on_event

    def safe(msg: str) -> None:
        try:
            report(msg)
        except (OSError, ValueError):
            pass

    return safe


class HostContext:
    """The backend of one host and what goes with it, for the length of one command.

    ``backend`` given: the context uses it and leaves it open (the caller owns it);
    else the simulated host ``sim`` (or ``$GPUSLATE_SIM``), else the NVIDIA driver,
    opened on first use: a verb checks its input first, so bad input is a
    :class:`~gpuslate.errors.UsageError` whether or not the host has GPUs.
    ``on_event`` receives progress lines (escaped by whoever prints them), ``on_progress``
    the waits under way (:class:`Progress`); a sink that fails is ignored. ``audit_context``
    is added to every audit entry (the Slurm job a hook ran for).
    """

    def __init__(self, sim: str | None = None, *, backend: GpuBackend | None = None,
                 on_event: Note | None = None, audit_context: dict[str, Any] | None = None,
                 on_progress: ProgressSink | None = None) -> None:
        self._sim = sim
        self._backend = backend
        self._owned = backend is None
        self.note: Note = quiet(on_event)
        self._on_progress = on_progress
        self._audit_context = audit_context
        self._audit: AuditLog | None = None
        self._lock: HostLock | None = None
        self._lock_depth = 0
        self._state: Path | None = None

    @property
    def backend(self) -> GpuBackend:
        """The GPU backend, opened on first use (:class:`~gpuslate.errors.BackendUnavailable`)."""
        if self._backend is None:
            self._backend = open_backend(self._sim)
        return self._backend

    @property
    def name(self) -> str:
        return self.backend.name

    @property
    def sim_root(self) -> str | None:
        """The simulated host's folder; None on a real host."""
        if self.backend.name != "sim":
            return None
        return str(self.backend.host.root)  # type: ignore[attr-defined]

    def ticker(self, task: str, limit_s: float | None, *, started: float | None = None) -> Ticker:
        """A :class:`Ticker` of one wait to this context's progress sink (use it as ``with``)."""
        return Ticker(self._on_progress, task, limit_s, started=started)

    def max_used(self, given: int | None = None) -> int:
        """``given``, else the most memory an idle GPU shows on this driver."""
        return default_max_used(self.backend) if given is None else given

    @property
    def lock_depth(self) -> int:
        """How many verbs of this context hold the host lock now (0: not held)."""
        return self._lock_depth

    @contextmanager
    def locked(self, purpose: str, *, timeout: float | None = None) -> Iterator[float]:
        """Hold the host lock for the block; yields the seconds spent waiting for it.

        Re-entrant: a verb called by a verb that holds the lock (``swap`` calling
        ``down`` and ``up``) counts one level more and waits for nothing; the lock
        is released when the outermost block ends. The wait counts against
        ``timeout`` (None: for ever) and is announced once, naming the holder
        (found through /proc/locks when it is not gpuslate).
        """
        if self._lock_depth:
            self._lock_depth += 1
            try:
                yield 0.0
            finally:
                self._lock_depth -= 1
            return
        from .lock import HostLock, default_lock_dir, describe_holder  # lazy: startup (see the module docstring)

        lock = HostLock(default_lock_dir(self.sim_root) / "host.lock", purpose=purpose)
        limit = f" (at most {timeout:g} s)" if timeout is not None else ""
        t0 = time.monotonic()
        lock.acquire(timeout=timeout, on_wait=lambda h: self.note(
            f"waiting for the host lock{limit}: held by {describe_holder(h)}"))
        self._lock, self._lock_depth = lock, 1
        try:
            yield time.monotonic() - t0
        finally:
            self._lock, self._lock_depth = None, 0
            lock.release()

    @property
    def audit_log(self) -> AuditLog:
        """The audit log, opened on first use (an unsafe state folder refuses then), its
        entries marked with this context's backend and host."""
        if self._audit is None:
            from .audit import AuditLog  # lazy: startup (see the module docstring)

            self._audit = AuditLog(backend=self.backend.name, sim_root=self.sim_root, context=self._audit_context)
        return self._audit

    def audit_for_reading(self) -> AuditLog:
        """The audit log to read, found without opening the backend (``audit`` needs no GPU):
        the simulated host given, else ``$GPUSLATE_SIM``, as :func:`~gpuslate.gpu.open_backend`
        chooses; a backend already open (or given) decides instead, as for :meth:`state_dir`."""
        if self._backend is not None:
            return self.audit_log
        from .audit import AuditLog  # lazy: startup (see the module docstring)

        return AuditLog(sim_root=self._sim)

    def add_audit_context(self, context: dict[str, Any]) -> None:
        """Mark every audit entry written from now on with ``context`` too (the Slurm job a
        hook runs for), whether or not the log is open yet."""
        self._audit_context = {**(self._audit_context or {}), **context}
        if self._audit is not None:
            self._audit.context = dict(self._audit_context)

    def state_dir(self) -> Path:
        """This host's state folder (checked, created 0700 when missing), the same one for every
        verb of this context: see :func:`~gpuslate.host.statedir.state_dir` for where it is.

        Found without opening the backend (``logs`` needs no GPU): the simulated host
        given, else ``$GPUSLATE_SIM``, as :func:`~gpuslate.gpu.open_backend` chooses; a
        backend already open (or given) decides instead. Every file in it is still
        reached through the checked walk of :mod:`~gpuslate.host.statedir` when it is
        opened; the path is what is kept."""
        if self._state is None:
            from .statedir import state_dir  # lazy: startup (see the module docstring)

            self._state = state_dir(self.sim_root if self._backend is not None else self._sim)
        return self._state

    def close(self) -> None:
        if self._owned and self._backend is not None:
            self._backend.close()
            self._backend = None

    def __enter__(self: _H) -> _H:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
