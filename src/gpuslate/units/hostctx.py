"""The backend and the host lock as the unit commands use them.

Kept apart from :mod:`.lifecycle` so that ``ps`` (:mod:`.listing`) and
``swap`` need not import ``up``/``down`` to open a backend: the import graph
of the units package has no cycle.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Iterator

from ..gpu import GpuBackend, open_backend
from ..host.lock import HostLock, default_lock_dir, describe_holder

Note = Callable[[str], None]


@contextmanager
def host_lock(backend: GpuBackend, purpose: str, use: bool, on_event: Note | None) -> Iterator[float]:
    """Hold the host lock (when ``use``); yields the seconds spent waiting for it."""
    if not use:
        yield 0.0
        return
    root = str(backend.host.root) if backend.name == "sim" else None  # type: ignore[attr-defined]
    lock = HostLock(default_lock_dir(root) / "host.lock", purpose=purpose)
    t0 = time.monotonic()
    lock.acquire(on_wait=lambda h: (on_event or (lambda _m: None))(
        f"waiting for the host lock: held by {describe_holder(h)}"))
    try:
        yield time.monotonic() - t0
    finally:
        lock.release()


@contextmanager
def backend_for(sim: str | None, backend: GpuBackend | None) -> Iterator[GpuBackend]:
    be = backend if backend is not None else open_backend(sim)
    try:
        yield be
    finally:
        if backend is None:
            be.close()
