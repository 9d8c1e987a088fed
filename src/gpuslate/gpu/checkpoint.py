"""The driver's checkpoint API on a real host: the only module that calls it, through NVIDIA's ``cuda-core``.

``cuda.core.checkpoint.Process(pid)`` (cuda-core 1.0 and later, with ``cuda-bindings`` 12.8+ or
13.0.2+; a driver whose CUDA version is 12.8 or later, R570) wraps ``cuCheckpointProcessGetState``,
``Lock``, ``Checkpoint``, ``Restore`` and ``Unlock``; gpuslate does not bind them itself. It is the
optional extra ``park`` (cuda-core, cuda-bindings and numpy: about 95 MB, and about 0.4 s to
import), so it is imported only here, when a checkpoint call is made, never on another command's
path. Without it a call raises :class:`~gpuslate.errors.UsageError` naming the line that installs
it, as every command that needs an extra does (:mod:`gpuslate.extras`).

Every error of the package becomes a gpuslate error in one place, :func:`_error`: a refusal of
the driver is a :class:`~gpuslate.errors.CheckpointError` carrying the driver's error name
(``CUDA_ERROR_ILLEGAL_STATE`` ...), read from the exception's text, where cuda-core puts it; a
missing driver library is :class:`~gpuslate.errors.BackendUnavailable`. The state rules are those
of :class:`~gpuslate.gpu.types.CheckpointState`.
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import BackendUnavailable, CheckpointError
from ..extras import Extra, require
from .types import CheckpointState

_CODE = re.compile(r"CUDA_ERROR_[A-Z_]+")
_UNSUPPORTED_HINT = ("the driver's checkpoint API needs an NVIDIA driver of release 570 or later (CUDA 12.8), and "
                     "cuda-bindings of the same CUDA major version (pip install 'cuda-bindings==12.*' on a "
                     "driver older than 580)")


class CudaCheckpoint:
    """The driver's checkpoint calls for one process at a time (module docstring)."""

    def _process(self, pid: int) -> Any:
        require("park", Extra.PARK)
        try:
            from cuda.core import checkpoint  # lazy: optional (the park extra; 0.4 s to import)
        except ImportError as exc:  # installed but broken (a cuda-bindings without the API)
            raise CheckpointError(f"cuda-core cannot be used: {exc}", driver_code="CUDA_ERROR_NOT_SUPPORTED",
                                  pid=pid, hint=_UNSUPPORTED_HINT) from None
        try:
            return checkpoint.Process(pid)
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"pid {pid!r}: {exc}", driver_code="CUDA_ERROR_INVALID_VALUE", pid=0) from None

    def _call(self, pid: int, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - every failure of the package becomes one typed error (_error)
            raise _error(exc, pid, what) from None

    def state(self, pid: int) -> CheckpointState:
        proc = self._process(pid)
        name = self._call(pid, "state", lambda: proc.state)
        try:
            return CheckpointState(name)
        except ValueError:  # a state this gpuslate does not know (a newer driver's): never guessed at
            raise CheckpointError(f"pid {pid}: the driver reports checkpoint state {name!r}, which gpuslate does not "
                                  "know", driver_code="CUDA_ERROR_UNKNOWN", pid=pid) from None

    def lock(self, pid: int, timeout_ms: int = 0) -> None:
        proc = self._process(pid)
        self._call(pid, "lock", proc.lock, timeout_ms)

    def checkpoint(self, pid: int) -> None:
        proc = self._process(pid)
        self._call(pid, "checkpoint", proc.checkpoint)

    def restore(self, pid: int) -> None:
        proc = self._process(pid)
        self._call(pid, "restore", proc.restore)

    def unlock(self, pid: int) -> None:
        proc = self._process(pid)
        self._call(pid, "unlock", proc.unlock)


def _error(exc: BaseException, pid: int, what: str) -> CheckpointError | BackendUnavailable:
    """One gpuslate error for anything cuda-core raised: the driver library missing (no driver),
    a driver without the API (cuda-core's RuntimeError says so in words), or the driver's refusal
    (its error name, which cuda-core's CUDAError puts in its text)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if type(exc).__name__ == "DynamicLibNotFoundError":
        return BackendUnavailable(f"the NVIDIA driver library cannot be loaded for the checkpoint API: {text}")
    m = _CODE.search(text)
    if m is None and "not supported by the installed NVIDIA driver" in text:
        return CheckpointError(f"{what} of pid {pid}: {text}", driver_code="CUDA_ERROR_NOT_SUPPORTED", pid=pid,
                               hint=_UNSUPPORTED_HINT)
    return CheckpointError(f"{what} of pid {pid}: {text}", driver_code=m.group(0) if m else "CUDA_ERROR_UNKNOWN",
                           pid=pid)
