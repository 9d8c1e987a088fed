"""What a GPU backend reports: plain, immutable, JSON-able records."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, NamedTuple, Protocol

from .._document import Fields

#: kinds of GPU-holding processes; ``handle`` is added by discovery (fd scan)
PROCESS_KINDS = ("compute", "graphics", "mps", "handle")


#: NVML's memory API: "v2" reports driver-reserved memory apart from 'used'
#: (drivers R510 and later), "v1" counts it as used
MemoryApi = Literal["v1", "v2"]


class MemoryInfo(NamedTuple):
    """Bytes. ``used`` excludes driver-reserved memory where the driver can tell (NVML v2)."""

    total: int
    used: int
    reserved: int
    free: int


class GpuProcess(NamedTuple):
    """A process as the driver reports it on one GPU."""

    pid: int
    kind: str  # compute | graphics | mps
    used_memory: int | None  # None when the driver does not say


class GpuReading(NamedTuple):
    """One GPU as one backend query saw it.

    ``error`` is set when any essential query (memory, processes) failed; then
    the fields that failed are ``None``: a failed query never reads as clean.
    """

    index: int  # type: ignore[assignment]  # the field shadows tuple.index, which nothing here calls
    uuid: str | None
    name: str | None
    minor: int | None  # /dev/nvidiaN of this GPU
    memory: MemoryInfo | None
    utilization_pct: int | None
    temperature_c: int | None
    power_w: float | None
    power_limit_w: float | None
    pstate: str | None
    processes: list[GpuProcess] | None
    error: str | None


def held_by_no_process(r: GpuReading) -> int | None:
    """Bytes the driver counts as used on this GPU that no process it lists holds: ``used`` minus
    the listed processes' memory (a process whose memory is not reported counts 0), never below 0.
    A leaked or driver-held context (or, for a moment, a teardown). None when the memory or the
    process list is unknown (a failed query): never 0 for what was not read.

    The one computation of the fact: the exporter's leaked memory, ``status``'s warning and the
    verdict of ``clear`` and ``wait`` all come from here. On drivers before R510 (NVML's v1
    memory API) ``used`` includes the driver's reserved memory, so the threshold a caller
    compares this with is the host's idle ``--max-used``."""
    if r.memory is None or r.processes is None:
        return None
    return max(0, r.memory.used - sum(p.used_memory or 0 for p in r.processes if p.kind != "handle"))


def memory_json(r: GpuReading) -> dict[str, Any]:
    """What a result document keeps of a reading: used memory, the pids listed, the error."""
    return {"gpu": r.index, "used": r.memory.used if r.memory else None,
            "processes": [p.pid for p in r.processes or []], "error": r.error}


def memory_from_json(d: object) -> GpuReading:
    """A reading back from :func:`memory_json` (what it does not keep is unknown: None, 0); every
    field checked (:class:`~gpuslate._document.Fields`)."""
    f = Fields(d)
    used = f.opt_size("used")
    return GpuReading(f.gpu("gpu"), None, None, None, MemoryInfo(0, used, 0, 0) if used is not None else None,
                      None, None, None, None, None,
                      [GpuProcess(pid, "compute", None) for pid in f.pids("processes")],
                      f.opt_text("error"))


def memory_info_from_json(d: object) -> MemoryInfo:
    """A GPU's ``memory`` of a status document: four sizes."""
    f = Fields(d)
    return MemoryInfo(f.size("total"), f.size("used"), f.size("reserved"), f.size("free"))


class GpuBackend(Protocol):
    """What every GPU backend provides (NVML on real hosts, ``sim`` on simulated ones)."""

    name: str
    @property
    def memory_api(self) -> MemoryApi:
        """Known from the moment the backend is open (decides the default --max-used)."""

    def driver_version(self) -> str | None: ...

    def device_count(self) -> int: ...

    def read(self, indices: Sequence[int] | None = None, *, full: bool = True) -> list[GpuReading]:
        """Read the given GPUs (all when ``None``). ``full=False`` reads only memory
        and processes, for tight verification loops."""
        ...

    def device_prefixes(self) -> tuple[str, ...]:
        """Path prefixes of this backend's device files, for the fd scan."""
        ...

    def gpu_for_path(self, path: str) -> int | None:
        """GPU index of a device file path, ``None`` for control devices (ctl, uvm...)."""
        ...

    def close(self) -> None: ...
