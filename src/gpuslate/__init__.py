"""gpuslate: safe, verified, fast hand-off of NVIDIA GPUs between model-server deployments.

The public API is re-exported here; the modules behind it are private in
spirit (their layout may change), the names below are the contract.

Names are imported on first use (PEP 562) so that ``gpuslate status`` does
not pay, at every start, for the modules of ``clear`` or ``up``: a CLI
invocation's cost is part of what gpuslate promises to keep low.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .errors import (
    BackendUnavailable,
    GpuQueryError,
    GpuslateError,
    Interrupted,
    NotConfirmed,
    NotDoneError,
    PartialFailure,
    PermissionDenied,
    ServerFailed,
    UsageError,
)

# public name -> module that defines it
_EXPORTS = {
    "Host": "gpuslate.api", "status": "gpuslate.api",
    "take_snapshot": "gpuslate.host.snapshot", "Snapshot": "gpuslate.host.snapshot",
    "GpuState": "gpuslate.host.snapshot", "HolderProcess": "gpuslate.host.snapshot", "open_backend": "gpuslate.gpu",
    "GpuBackend": "gpuslate.gpu", "ProcessId": "gpuslate.proc.procfs",
    "clear": "gpuslate.api", "ClearResult": "gpuslate.clearing.clear", "ClearOptions": "gpuslate.options",
    "Selection": "gpuslate.options",
    "wait_free": "gpuslate.api", "WaitResult": "gpuslate.clearing.wait", "WaitOptions": "gpuslate.options",
    "UnitSpec": "gpuslate.units.spec", "UpOptions": "gpuslate.options",
    "DownOptions": "gpuslate.options", "SwapOptions": "gpuslate.options",
    "PsOptions": "gpuslate.options", "RestartOptions": "gpuslate.options",
    "RemoteHost": "gpuslate.remote.host", "Verbs": "gpuslate.verbs",
    "AuditOptions": "gpuslate.options", "LogsOptions": "gpuslate.options",
}

if TYPE_CHECKING:
    from .api import Host, clear, status, wait_free
    from .clearing.clear import ClearResult
    from .clearing.wait import WaitResult
    from .gpu import GpuBackend, open_backend
    from .host.snapshot import GpuState, HolderProcess, Snapshot, take_snapshot
    from .options import (
        AuditOptions,
        ClearOptions,
        DownOptions,
        LogsOptions,
        PsOptions,
        RestartOptions,
        Selection,
        SwapOptions,
        UpOptions,
        WaitOptions,
    )
    from .remote.host import RemoteHost
    from .units.spec import UnitSpec
    from .verbs import Verbs


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gpuslate' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_EXPORTS))


__all__ = [  # written out (not built from _EXPORTS) so that linters and type checkers see it; a test compares
    "AuditOptions",
    "BackendUnavailable",
    "ClearOptions",
    "ClearResult",
    "DownOptions",
    "GpuBackend",
    "GpuQueryError",
    "GpuState",
    "GpuslateError",
    "HolderProcess",
    "Host",
    "Interrupted",
    "LogsOptions",
    "NotConfirmed",
    "NotDoneError",
    "PartialFailure",
    "PermissionDenied",
    "ProcessId",
    "PsOptions",
    "RemoteHost",
    "RestartOptions",
    "Selection",
    "ServerFailed",
    "Snapshot",
    "SwapOptions",
    "UnitSpec",
    "UpOptions",
    "UsageError",
    "Verbs",
    "WaitOptions",
    "WaitResult",
    "__version__",
    "clear",
    "open_backend",
    "status",
    "take_snapshot",
    "wait_free",
]
