"""gpuslate: safe, verified, fast hand-off of NVIDIA GPUs between model-server deployments.

The public API is re-exported here; the modules behind it are private in
spirit (their layout may change), the names below are the contract.

Names are imported on first use (PEP 562) so that ``gpuslate status`` does
not pay, at every start, for the modules of ``clear`` or ``up``: a CLI
invocation's cost is part of what gpuslate promises to keep low.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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

__version__ = "0.1.0"

__all__ = [
    "BackendUnavailable", "ClearResult", "GpuBackend", "GpuQueryError", "GpuState", "GpuslateError", "HolderProcess",
    "Interrupted", "NotDoneError", "PartialFailure", "PermissionDenied", "ProcessId", "ServerFailed", "Snapshot",
    "UsageError", "WaitResult", "__version__", "clear", "open_backend", "status", "take_snapshot", "wait_free",
]

# public name -> module that defines it
_EXPORTS = {
    "status": "gpuslate.api", "take_snapshot": "gpuslate.host.snapshot", "Snapshot": "gpuslate.host.snapshot",
    "GpuState": "gpuslate.host.snapshot", "HolderProcess": "gpuslate.host.snapshot", "open_backend": "gpuslate.gpu",
    "GpuBackend": "gpuslate.gpu", "ProcessId": "gpuslate.proc.procfs",
    "clear": "gpuslate.slate.clear", "ClearResult": "gpuslate.slate.clear",
    "wait_free": "gpuslate.slate.wait", "WaitResult": "gpuslate.slate.wait",
}

if TYPE_CHECKING:
    from .api import status
    from .gpu import GpuBackend, open_backend
    from .host.snapshot import GpuState, HolderProcess, Snapshot, take_snapshot
    from .proc.procfs import ProcessId
    from .slate.clear import ClearResult, clear
    from .slate.wait import WaitResult, wait_free


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gpuslate' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_EXPORTS))


__all__ = [
    "__version__", *_EXPORTS,
    "GpuslateError", "UsageError", "BackendUnavailable", "GpuQueryError", "NotDoneError",
    "PermissionDenied", "ServerFailed", "PartialFailure", "Interrupted",
]
