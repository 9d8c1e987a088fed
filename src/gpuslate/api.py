"""Top-level conveniences of the public API (re-exported by ``gpuslate``)."""

from __future__ import annotations

from .gpu import open_backend
from .host.snapshot import Snapshot, take_snapshot


def status(gpus: list[int] | None = None, *, sim: str | None = None) -> Snapshot:
    """Snapshot of the selected GPUs (all by default) and every process that holds them."""
    backend = open_backend(sim)
    try:
        return take_snapshot(backend, gpus)
    finally:
        backend.close()
