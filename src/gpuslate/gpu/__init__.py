"""GPU backends behind one protocol: NVML on real hosts, ``sim`` on simulated ones."""

from __future__ import annotations

import os

from ..errors import UsageError
from .types import CheckpointState, GpuBackend, GpuProcess, GpuReading, HostMemory, MemoryInfo

__all__ = ["SIM_VAR", "CheckpointState", "GpuBackend", "GpuProcess", "GpuReading", "HostMemory", "MemoryInfo",
           "open_backend", "sim_root_from_env"]

#: the environment variable that names a simulated host (the CLI's --sim sets it for what it starts)
SIM_VAR = "GPUSLATE_SIM"


def sim_root_from_env() -> str | None:
    """``$GPUSLATE_SIM`` (``~`` expanded), or None when unset or empty.

    A relative one is refused (UsageError), as a relative state folder is (host/statedir.py,
    ``absolute_setting``): each gpuslate process would take it from its own current folder, so a
    command run after a ``cd`` would act on another simulated host, with another state folder and
    lock, or on none. (``--sim DIR`` is made absolute once by the CLI, which exports it so.)"""
    value = os.environ.get(SIM_VAR)
    if not value:
        return None
    path = os.path.expanduser(value)
    if not os.path.isabs(path):
        raise UsageError(f"{SIM_VAR} must be an absolute path, not {value!r}: a relative one would name another "
                         "simulated host from every folder gpuslate runs in", hint=f'export {SIM_VAR}="$PWD/{value}"')
    return path


def open_backend(sim: str | os.PathLike[str] | None = None) -> GpuBackend:
    """The simulated host at ``sim`` (or ``$GPUSLATE_SIM``), else the NVIDIA driver.

    Raises :class:`~gpuslate.errors.BackendUnavailable` when neither is there.
    """
    root = sim if sim is not None else sim_root_from_env()
    if root:
        from .simhost import SimBackend  # lazy: startup

        return SimBackend(root)
    from .nvml import open_nvml  # lazy: startup

    return open_nvml()
