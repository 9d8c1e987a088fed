"""gpuslate: safe, verified, fast hand-off of NVIDIA GPUs between model-server deployments.

The public API is re-exported here; the modules behind it are private in
spirit (their layout may change), the names below are the contract.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .errors import (
    BackendUnavailable,
    GpuQueryError,
    GpuslateError,
    Interrupted,
    NotDoneError,
    PartialFailure,
    PermissionDenied,
    ServerFailed,
    UsageError,
)
from .gpu import GpuBackend, open_backend
from .proc.procfs import ProcessId
from .snapshot import GpuState, HolderProcess, Snapshot, take_snapshot
from .clear import ClearResult, clear
from .wait import WaitResult, wait_free


def status(gpus: list[int] | None = None, *, sim: str | None = None) -> Snapshot:
    """Snapshot of the selected GPUs (all by default) and their processes."""
    backend = open_backend(sim)
    try:
        return take_snapshot(backend, gpus)
    finally:
        backend.close()


__all__ = [
    "__version__", "status", "take_snapshot", "open_backend", "GpuBackend", "Snapshot", "GpuState",
    "HolderProcess", "ProcessId", "clear", "ClearResult", "wait_free", "WaitResult",
    "GpuslateError", "UsageError", "BackendUnavailable", "GpuQueryError", "NotDoneError",
    "PermissionDenied", "ServerFailed", "PartialFailure", "Interrupted",
]
