"""The one exception hierarchy of gpuslate.

Every error the library raises on purpose derives from :class:`GpuslateError`.
The CLI maps each class to an exit code in exactly one place
(:mod:`gpuslate.cli.exits`); the library itself never exits.

    GpuslateError
    ├── UsageError                 bad input: a malformed GPU list, size, flag or file
    ├── BackendUnavailable         no NVIDIA driver / NVML, no simulated host
    ├── GpuQueryError              one query on one GPU failed (kept per GPU in snapshots)
    ├── NotDoneError               a wait or verification ran out of time
    ├── PermissionDenied           the OS refused (signal, /proc, lock, state folder)
    ├── ServerFailed               a managed server exited or failed readiness
    ├── PartialFailure             some hosts or targets failed, the rest succeeded
    └── Interrupted                the user interrupted (Ctrl-C)
"""

from __future__ import annotations


class GpuslateError(Exception):
    """Base of every error gpuslate raises on purpose."""

    #: short machine-readable name used in JSON error documents
    code = "error"

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class UsageError(GpuslateError, ValueError):
    """Bad input from the user; nothing was done."""

    code = "usage"


class BackendUnavailable(GpuslateError):
    """Neither an NVIDIA driver nor a simulated host can be used."""

    code = "backend_unavailable"


class GpuQueryError(GpuslateError):
    """A query on one GPU failed. A failed query never reads as 'no processes'."""

    code = "gpu_query"


class NotDoneError(GpuslateError):
    """A wait or a verification did not succeed within its timeout."""

    code = "timeout"


class PermissionDenied(GpuslateError, PermissionError):
    """The operating system refused an operation."""

    code = "permission"


class ServerFailed(GpuslateError):
    """A managed server exited before it was ready, or failed its readiness check."""

    code = "server_failed"


class PartialFailure(GpuslateError):
    """Some hosts or targets failed while others succeeded."""

    code = "partial"


class Interrupted(GpuslateError):
    """The user interrupted the operation."""

    code = "interrupted"
