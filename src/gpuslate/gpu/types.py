"""What a GPU backend reports: plain, immutable, JSON-able records."""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import Any, Literal, NamedTuple, Protocol

from .._document import Fields
from .._record import Record


class ProcessKind(str, Enum):
    """How a process holds a GPU: a context the driver lists (compute, graphics, or a client of an MPS
    server), or only an open device file, which discovery's fd scan adds (``handle``: a monitor, a
    daemon, a process between contexts). The value is what documents write."""

    COMPUTE = "compute"
    GRAPHICS = "graphics"
    MPS = "mps"
    HANDLE = "handle"

    def __str__(self) -> str:  # its value, as documents and tables write it (not "ProcessKind.HANDLE")
        return self.value


#: kinds of GPU-holding processes, as documents write them
PROCESS_KINDS = tuple(k.value for k in ProcessKind)


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
    kind: ProcessKind  # compute | graphics | mps
    used_memory: int | None  # None when the driver does not say


class GpuReading(Record):
    """One GPU as one backend query saw it; built by keywords (a dozen fields, most of them None
    in a reading that failed: a positional call could put a figure in the wrong place unseen).

    ``error`` is set when any essential query (memory, processes) failed; then
    the fields that failed are ``None``: a failed query never reads as clean.
    """

    index: int
    uuid: str | None = None
    name: str | None = None
    minor: int | None = None  # /dev/nvidiaN of this GPU
    memory: MemoryInfo | None = None
    utilization_pct: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    pstate: str | None = None
    processes: list[GpuProcess] | None = None
    error: str | None = None


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
    return max(0, r.memory.used - sum(p.used_memory or 0 for p in r.processes if p.kind != ProcessKind.HANDLE))


def memory_json(r: GpuReading) -> dict[str, Any]:
    """What a result document keeps of a reading: used memory, the pids listed, the error."""
    return {"gpu": r.index, "used": r.memory.used if r.memory else None,
            "processes": [p.pid for p in r.processes or []], "error": r.error}


def memory_from_json(d: object) -> GpuReading:
    """A reading back from :func:`memory_json` (what it does not keep is unknown: None, 0); every
    field checked (:class:`~gpuslate._document.Fields`)."""
    f = Fields(d)
    used = f.opt_size("used")
    return GpuReading(index=f.gpu("gpu"), memory=MemoryInfo(0, used, 0, 0) if used is not None else None,
                      processes=[GpuProcess(pid, ProcessKind.COMPUTE, None) for pid in f.pids("processes")],
                      error=f.opt_text("error"))


def memory_info_from_json(d: object) -> MemoryInfo:
    """A GPU's ``memory`` of a status document: four sizes."""
    f = Fields(d)
    return MemoryInfo(f.size("total"), f.size("used"), f.size("reserved"), f.size("free"))


class CheckpointState(Enum):
    """A process's state under the driver's checkpoint API (``CUprocessState``; cuda-core's
    ``Process.state`` names them so). The driver's rules, which every backend follows:
    ``lock`` needs RUNNING and leaves LOCKED (further CUDA calls of the process block);
    ``checkpoint`` needs LOCKED and leaves CHECKPOINTED (its device memory copied into host
    memory, its GPU allocations and handles released: the driver no longer lists it on any GPU);
    ``restore`` needs CHECKPOINTED and leaves LOCKED (memory back at the same addresses, on the
    same GPUs); ``unlock`` needs LOCKED and leaves RUNNING. Any other call is refused
    (``CUDA_ERROR_ILLEGAL_STATE``). FAILED: an error the driver could not undo (IPC or UVM memory
    met while checkpointing): the process can no longer use CUDA; only its end frees what it held."""

    RUNNING = "running"
    LOCKED = "locked"
    CHECKPOINTED = "checkpointed"
    FAILED = "failed"


class HostMemory(NamedTuple):
    """Bytes of host memory (``/proc/meminfo``'s MemTotal and MemAvailable; on a simulated host,
    its own): what a park that offloads (an engine's level-1 sleep, the driver's checkpoint)
    moves there must fit in ``available``."""

    total: int
    available: int


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

    def host_memory(self) -> HostMemory | None:
        """The host's memory now; None when it cannot be read (never taken for plenty)."""
        ...

    # -- the driver's checkpoint API (see CheckpointState for its rules). ``pid`` is a process
    # (a thread-group id): the driver acts on the process of any thread id it is given, so callers
    # pass only identities they have checked. Refusals raise CheckpointError with the driver's code.
    def checkpoint_state(self, pid: int) -> CheckpointState: ...

    def checkpoint_lock(self, pid: int, *, timeout_ms: int = 0) -> None:
        """``timeout_ms`` 0: wait as long as the process's submitted work takes; else give up after
        it (CUDA_ERROR_TIMEOUT), the process left RUNNING."""
        ...

    def checkpoint(self, pid: int) -> None: ...

    def checkpoint_restore(self, pid: int) -> None: ...

    def checkpoint_unlock(self, pid: int) -> None: ...

    def close(self) -> None: ...
