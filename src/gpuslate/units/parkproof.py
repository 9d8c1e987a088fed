"""Park, proven: pure decisions over the facts a park gathers (NVML readings, host memory).

A park says its memory left; only NVML can show that it did. These functions take what was read
before and after, and decide, with the figure per process and GPU, so that ``gpuslate park`` (and
``swap --park``, which falls back to a cold stop and start on a failed proof) reports exactly what
did not leave. Nothing here reads or acts: the verbs gather, this decides (``hypothesis`` model
tests in tests/units/test_parkproof.py).

* :func:`prove_parked`: every process of the unit let go of its memory down to its method's
  residue, and every GPU of the unit is as free as ``wait --free`` would call it, but for those
  residues. The residue: for the driver's checkpoint, none at all: the process must be gone from
  every GPU's list (a checkpointed process holds no context); for an engine's sleep or release, at
  most what was measured at start for that process on that GPU (the CUDA context and what the
  engine keeps, e.g. its CUDA graphs: about 1 GB per GPU for a vLLM of #32714, against 16 GB when it
  leaks). A reading that failed, or memory the driver does not report per process, is never taken
  for free: the park is not proven.
* :func:`host_memory_fits`: a park that moves memory into host memory (a vLLM level-1 sleep's
  weights, SGLang's CPU backup, the driver's checkpoint) goes ahead only when what moves fits in
  ``MemAvailable`` with a margin; unknown host memory is never taken for plenty.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from enum import Enum
from typing import NamedTuple

from .._parse import format_size
from ..gpu.types import GpuReading, HostMemory, ProcessKind

GiB = 1024**3


class ParkMethod(Enum):
    """How a unit is parked, as far as the proof cares: what may stay on the GPU."""

    CHECKPOINT = "checkpoint"  # the driver's checkpoint: the process leaves every GPU's list
    ENGINE = "engine"  # the engine's own (vLLM sleep, SGLang release): a residue measured at start


class ProcessFigure(NamedTuple):
    """One process of the unit on one GPU: what it held before the park, after, and may keep."""

    pid: int
    gpu: int
    before: int | None  # None: not listed there before
    after: int | None  # None: not listed after (bytes unknown while listed: see ``listed``)
    listed: bool  # the driver still lists it on this GPU after the park
    allowed: int  # the residue it may keep (0 for a checkpoint, and it must not be listed)
    ok: bool


class GpuFigure(NamedTuple):
    """One GPU of the unit after the park: its used memory, what the unit may keep, the threshold."""

    gpu: int
    used: int | None  # None: the reading failed
    kept: int  # the unit's residues on it (at most what each process may keep)
    max_used: int
    ok: bool


class ParkProof(NamedTuple):
    """The verdict: parked only when every figure is ok and nothing was unread."""

    parked: bool
    processes: tuple[ProcessFigure, ...]
    gpus: tuple[GpuFigure, ...]
    problems: tuple[str, ...]  # one line per figure that failed, and per reading that could not be used


def prove_parked(before: Sequence[GpuReading], after: Sequence[GpuReading], pids: Iterable[int], gpus: Iterable[int],
                 method: ParkMethod, *, residue: Mapping[tuple[int, int], int] | None = None, max_used: int = 0,
                 baseline: Mapping[int, int] | None = None) -> ParkProof:
    """Decide whether the unit's processes ``pids`` parked on ``gpus`` (and on every GPU they held
    before), from the readings ``before`` and ``after`` the park.

    ``residue[(pid, gpu)]``: what that process may keep there after an engine's park (measured when
    the unit started; absent: 0). ``max_used`` and ``baseline[gpu]`` (what spared GPU daemons hold)
    are ``wait --free``'s threshold: a GPU is free when its used memory, less the daemons' baseline
    and the unit's allowed residues, is at most ``max_used``."""
    unit = frozenset(pids)
    residue = residue or {}
    baseline = baseline or {}
    problems: list[str] = []
    held_before: dict[tuple[int, int], int | None] = {}
    for b in before:
        for p in b.processes or []:
            if p.pid in unit and p.kind is not ProcessKind.HANDLE:
                held_before[(p.pid, b.index)] = (held_before.get((p.pid, b.index)) or 0) + (p.used_memory or 0)
    wanted = set(gpus) | {g for _, g in held_before}
    readings = {r.index: r for r in after}
    procs: list[ProcessFigure] = []
    figures: list[GpuFigure] = []
    for gpu in sorted(wanted):
        r = readings.get(gpu)
        if r is None or r.error is not None or r.memory is None or r.processes is None:
            why = r.error if r is not None and r.error else "not read"
            problems.append(f"GPU {gpu}: its memory after the park is unknown ({why}): not proven")
            figures.append(GpuFigure(gpu, None, 0, max_used, False))
            continue
        after_of: dict[int, int | None] = {}
        for p in r.processes:
            if p.pid in unit and p.kind is not ProcessKind.HANDLE:
                prev = after_of.get(p.pid, 0)
                after_of[p.pid] = None if prev is None or p.used_memory is None else prev + p.used_memory
        kept = 0
        for pid in sorted(unit | set(after_of)):
            if (pid, gpu) not in held_before and pid not in after_of:
                continue
            listed = pid in after_of
            now = after_of.get(pid)
            allowed = 0 if method is ParkMethod.CHECKPOINT else residue.get((pid, gpu), 0)
            if method is ParkMethod.CHECKPOINT:
                ok = not listed
                if not ok:
                    problems.append(f"pid {pid} is still on GPU {gpu}'s list after its checkpoint"
                                    + (f" ({format_size(now)})" if now is not None else ""))
            elif listed and now is None:
                ok = False
                problems.append(f"pid {pid} on GPU {gpu}: the driver does not report its memory: not proven")
            else:
                ok = (now or 0) <= allowed
                if not ok:
                    problems.append(f"pid {pid} still holds {format_size(now or 0)} on GPU {gpu}, more than the "
                                    f"{format_size(allowed)} it may keep")
            kept += min(now or 0, allowed)
            procs.append(ProcessFigure(pid, gpu, held_before.get((pid, gpu)), now, listed, allowed, ok))
        used = r.memory.used
        free_ok = used - baseline.get(gpu, 0) - kept <= max_used
        if not free_ok:
            problems.append(f"GPU {gpu}: {format_size(used)} used after the park, more than the unit may keep "
                            f"({format_size(kept)}) and the threshold ({format_size(max_used)})")
        figures.append(GpuFigure(gpu, used, kept, max_used, free_ok))
    parked = not problems and all(f.ok for f in procs) and all(g.ok for g in figures)
    return ParkProof(parked, tuple(procs), tuple(figures), tuple(problems))


class HostFit(NamedTuple):
    """Whether what a park moves into host memory fits, and the figures."""

    fits: bool
    moving: int
    available: int | None
    margin: int
    why: str


#: what a park leaves free in host memory, at least: 8 GiB, and a tenth of the host's memory
HOST_MARGIN_BYTES = 8 * GiB
HOST_MARGIN_FRACTION = 0.10


def host_memory_fits(moving: int, host: HostMemory | None, *, margin_bytes: int = HOST_MARGIN_BYTES,
                     margin_fraction: float = HOST_MARGIN_FRACTION) -> HostFit:
    """``moving`` bytes go into host memory (0: nothing moves, which always fits); they fit when
    ``MemAvailable`` keeps at least ``max(margin_bytes, margin_fraction * MemTotal)`` after them.
    Unknown host memory never fits."""
    if moving <= 0:
        return HostFit(True, 0, host.available if host else None, 0, "nothing moves into host memory")
    if host is None:
        return HostFit(False, moving, None, 0, "the host's available memory is unknown (/proc/meminfo): "
                       f"{format_size(moving)} would move into it")
    margin = max(margin_bytes, math.ceil(margin_fraction * host.total))
    fits = moving + margin <= host.available
    why = (f"{format_size(moving)} move into host memory, {format_size(host.available)} available, "
           f"{format_size(margin)} kept free")
    return HostFit(fits, moving, host.available, margin, why if fits else f"does not fit: {why}")
