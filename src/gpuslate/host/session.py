"""The host session: one host, opened once, for one command.

Opening the GPU backend, knowing what it can do (its memory API, and so what
an idle GPU's "used" memory looks like), taking the host lock with a timeout
and a "waiting for ..." line that names the holder, opening the audit log that
records which backend and host a signal was for, and closing: written once,
here, and used by every command that touches GPUs (``clear``, ``wait``,
``up``, ``down``, ``swap``, ``ps``, the library's ``status()``).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Iterator

from ..gpu import GpuBackend, open_backend
from .audit import AuditLog
from .lock import HostLock, default_lock_dir, describe_holder

MiB = 1024**2
#: the default --max-used: an idle GPU counts as free on drivers with and without NVML's v2 memory
#: API. v2 drivers (R510+) report driver-reserved memory apart from 'used' (an idle GPU reads 0);
#: v1 drivers count it as used (645 MB on an H200).
DEFAULT_MAX_USED_V2 = 64 * MiB
DEFAULT_MAX_USED_V1 = 1024 * MiB

Note = Callable[[str], None]


def default_max_used(backend: GpuBackend) -> int:
    return DEFAULT_MAX_USED_V1 if getattr(backend, "memory_api", "v2") == "v1" else DEFAULT_MAX_USED_V2


class HostSession:
    """The backend of one host and what goes with it, for the length of one command.

    ``backend`` given: the session uses it and leaves it open (the caller owns it).
    """

    def __init__(self, sim: str | None = None, backend: GpuBackend | None = None) -> None:
        self.backend = backend if backend is not None else open_backend(sim)
        self._owned = backend is None

    @property
    def name(self) -> str:
        return self.backend.name

    @property
    def sim_root(self) -> str | None:
        """The simulated host's folder; None on a real host."""
        return str(self.backend.host.root) if self.backend.name == "sim" else None  # type: ignore[attr-defined]

    def max_used(self, given: int | None = None) -> int:
        """``given``, else the most memory an idle GPU shows on this driver."""
        return default_max_used(self.backend) if given is None else given

    @contextmanager
    def locked(self, purpose: str, *, timeout: float | None = None, on_event: Note | None = None,
               use: bool = True) -> Iterator[float]:
        """Hold the host lock (when ``use``) for the block; yields the seconds spent waiting.

        The wait counts against ``timeout`` (None: for ever) and is announced once,
        naming the holder (found through /proc/locks when it is not gpuslate).
        """
        if not use:
            yield 0.0
            return
        lock = HostLock(default_lock_dir(self.sim_root) / "host.lock", purpose=purpose)
        note = on_event or (lambda _m: None)
        limit = f" (at most {timeout:g} s)" if timeout is not None else ""
        t0 = time.monotonic()
        lock.acquire(timeout=timeout, on_wait=lambda h: note(
            f"waiting for the host lock{limit}: held by {describe_holder(h)}"))
        try:
            yield time.monotonic() - t0
        finally:
            lock.release()

    def audit_log(self) -> AuditLog:
        """The audit log, its entries marked with this session's backend and host."""
        return AuditLog(backend=self.backend.name, sim_root=self.sim_root)

    def close(self) -> None:
        if self._owned:
            self.backend.close()

    def __enter__(self) -> HostSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
