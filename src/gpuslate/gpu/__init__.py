"""GPU backends behind one protocol: NVML on real hosts, ``sim`` on simulated ones."""

from __future__ import annotations

import os

from .types import GpuBackend, GpuProcess, GpuReading, MemoryInfo

__all__ = ["SIM_VAR", "GpuBackend", "GpuProcess", "GpuReading", "MemoryInfo", "open_backend", "sim_root_from_env"]

#: the environment variable that names a simulated host (the CLI's --sim sets it for what it starts)
SIM_VAR = "GPUSLATE_SIM"


def sim_root_from_env() -> str | None:
    return os.environ.get(SIM_VAR) or None


def open_backend(sim: str | os.PathLike[str] | None = None) -> GpuBackend:
    """The simulated host at ``sim`` (or ``$GPUSLATE_SIM``), else the NVIDIA driver.

    Raises :class:`~gpuslate.errors.BackendUnavailable` when neither is there.
    """
    root = sim if sim is not None else sim_root_from_env()
    if root:
        from .sim import SimBackend  # lazy: startup

        return SimBackend(root)
    from .nvml import open_nvml  # lazy: startup

    return open_nvml()
