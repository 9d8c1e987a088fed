"""Top-level conveniences of the public API (re-exported by ``gpuslate``)."""

from __future__ import annotations

from .host.session import HostSession
from .host.snapshot import Snapshot, take_snapshot


def status(gpus: list[int] | None = None, *, sim: str | None = None) -> Snapshot:
    """Snapshot of the selected GPUs (all by default) and every process that holds them."""
    with HostSession(sim) as host:
        return take_snapshot(host.backend, gpus)
