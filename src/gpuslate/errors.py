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

Remote hosts (``--host``) fail in named ways, each under the class whose exit
code fits: unreachable, stalled (an answer that does not end in time) and
gpuslate-missing hosts are an unavailable backend (3), a refused key or a
changed host key a permission problem (5), a host that does not connect in
time a timeout (4), an incompatible remote gpuslate or a document that cannot
be read (too large, nested too deep, not UTF-8, not an object) a usage
problem (2); a remote command that ran and failed keeps its own code.
``install`` adds two: a host without Python >= 3.10 cannot run gpuslate (3),
and files it may not write there are a permission problem (5).
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


class CheckpointError(GpuQueryError):
    """The driver refused a checkpoint operation on a process (``cuCheckpointProcess*``).

    ``driver_code`` is the driver's error name (``CUDA_ERROR_ILLEGAL_STATE``: the process is not
    in the state the call needs; ``CUDA_ERROR_NOT_SUPPORTED``: IPC or UVM memory, or a driver
    without the API; ``CUDA_ERROR_NOT_PERMITTED``; ``CUDA_ERROR_OUT_OF_MEMORY``: no room to restore,
    or no host memory to checkpoint into; ``CUDA_ERROR_TIMEOUT``: a lock that timed out), so a
    caller decides on the name, never on the wording. ``pid`` is the process asked about."""

    code = "checkpoint"

    def __init__(self, message: str, *, driver_code: str, pid: int, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.driver_code = driver_code
        self.pid = pid


class NotDoneError(GpuslateError):
    """A wait or a verification did not succeed within its timeout."""

    code = "timeout"


class PermissionDenied(GpuslateError, PermissionError):
    """The operating system refused an operation."""

    code = "permission"


class FileTooLarge(PermissionDenied):
    """A file gpuslate was given is larger than what it reads of one (refused, never read whole)."""

    code = "too_large"


class ServerFailed(GpuslateError):
    """A managed server exited before it was ready, or failed its readiness check."""

    code = "server_failed"


class PartialFailure(GpuslateError):
    """Some hosts or targets failed while others succeeded."""

    code = "partial"


class Interrupted(GpuslateError):
    """The user interrupted the operation."""

    code = "interrupted"


class NotConfirmed(Interrupted):
    """The person asked answered no (``clear``'s question): nothing was done. Exit 130, as an
    interrupt, and its JSON error type is ``interrupted``; said plainly, not as an error."""


# -- remote hosts (see gpuslate.remote) ------------------------------------------


class HostUnreachable(BackendUnavailable):
    """ssh could not reach the host (refused, no route, unknown name, closed)."""

    code = "unreachable"


class GpuslateMissing(BackendUnavailable):
    """The host answers but has no gpuslate to run."""

    code = "gpuslate_missing"


class HostAuthRefused(PermissionDenied):
    """The host refused every key ssh offered."""

    code = "auth_refused"


class HostKeyChanged(PermissionDenied):
    """The host's key differs from the one in known_hosts (or is not known, in batch mode)."""

    code = "host_key_changed"


class HostStalled(BackendUnavailable):
    """The host answered but did not finish within the time limit (a peer that stalls mid-answer)."""

    code = "stalled"


class HostTimedOut(NotDoneError):
    """The host did not answer within the connect timeout."""

    code = "timed_out"


class RemoteIncompatible(UsageError):
    """The remote gpuslate speaks a schema version this one does not understand."""

    code = "incompatible"


class BadDocument(RemoteIncompatible):
    """A result document that cannot be read back: another schema or version, or malformed."""

    code = "bad_document"


class RemoteCommandFailed(GpuslateError):
    """The remote gpuslate ran and failed; ``exit_code`` is its own exit status."""

    code = "command_failed"

    def __init__(self, message: str, *, exit_code: int, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.exit_code = exit_code


class RemotePythonUnsupported(BackendUnavailable):
    """``install``: the host has no ``python3`` (or the one given), or one older than 3.10."""

    code = "python_unsupported"


class InstallFailed(PermissionDenied):
    """``install``: the host refused the files (permission, a read-only or full file system)."""

    code = "install_failed"


class NotRun(PartialFailure):
    """A host was not run because an earlier host failed (``swap`` without --keep-going)."""

    code = "not_run"
