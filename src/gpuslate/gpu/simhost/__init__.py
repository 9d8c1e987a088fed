"""Simulated GPUs: the ``sim`` backend (:class:`SimBackend`, here) and the host folder it reads.

A simulated GPU host is a GPU backend like NVML, so it lives beside the NVML
backend, below everything that discovers, terminates and verifies
(``proc/`` is all it uses): :mod:`.host` is the folder (``gpuslate sim init``),
:mod:`.records` the simulated driver's bookkeeping, :mod:`.holder` the real
processes that hold its memory (``gpuslate sim hold``). The simulated
*inference server* (``gpuslate sim serve``) is a client of GPUs, not a GPU,
and lives above in :mod:`gpuslate.sim`.

Everything above this package (discovery, termination, verification) runs for
real against it: memory is held by real processes and their device files are
found by the same fd scan as real ``/dev/nvidia*`` files. Like NVML, the
backend reports host pids, from the processes that hold the memory (see
:mod:`gpuslate.gpu.simhost.records`), and a record it cannot read makes that GPU's
reading an error, never clean.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from ..types import CheckpointState, GpuProcess, GpuReading, HostMemory, MemoryApi, MemoryInfo, ProcessKind
from .checkpoint import SimCheckpoint
from .host import SimHost


class SimBackend:
    name = "sim"

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.host = SimHost(root)
        # fails now, clearly, if the folder is no simulated host; like NVML, the
        # memory API is known from the moment the backend is open
        self.memory_api: MemoryApi = "v1" if self.host.memory_api == "v1" else "v2"
        # the device files as an fd table shows them: the walked folder's real path (see SimHost.real_dev)
        self._dev_re = re.compile(re.escape(self.host.real_dev) + r"/nvidia(\d+)")

    def driver_version(self) -> str | None:
        return str(self.host.config["driver_version"])

    def device_count(self) -> int:
        return self.host.gpu_count

    def device_prefixes(self) -> tuple[str, ...]:
        return (f"{self.host.real_dev}/nvidia",)

    def gpu_for_path(self, path: str) -> int | None:
        m = self._dev_re.fullmatch(path.removesuffix(" (deleted)"))
        if not m or int(m.group(1)) >= self.host.gpu_count:
            return None
        return int(m.group(1))

    def read(self, indices: Sequence[int] | None = None, *, full: bool = True) -> list[GpuReading]:
        cfg = self.host.config
        count = self.host.gpu_count
        if indices is None:
            indices = range(count)
        total = int(cfg["memory"])
        reserved = int(cfg["reserved"])
        used = dict.fromkeys(indices, 0)
        procs: dict[int, dict[int, GpuProcess]] = {i: {} for i in indices}
        try:
            root = self.host.root_dir()  # one walk for both
        except OSError:  # the host's folder went away or was swapped: survey says what it finds
            self.host.stall()
            survey = self.host.survey()
        else:
            with root:
                self.host.stall(root)  # DIR/stuck: a driver call that hangs, on purpose
                survey = self.host.survey(root=root)
        for held in survey.held:
            rec = held.record
            if rec.gpu not in used:
                continue
            used[rec.gpu] += rec.bytes
            if rec.pid is not None:  # the owner as the host sees it; None: no process to name
                prev = procs[rec.gpu].get(rec.pid)
                amount = rec.bytes + ((prev.used_memory or 0) if prev else 0)
                procs[rec.gpu][rec.pid] = GpuProcess(rec.pid, ProcessKind(rec.kind), amount)
        out = []
        for i in indices:
            problems = survey.problems.get(i, []) + survey.problems.get(None, [])
            if problems:  # like a failed NVML query: unknown, never clean
                more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
                out.append(GpuReading(index=i, uuid=cfg["uuids"][i], name=cfg["name"], minor=i,
                                      error=problems[0] + more))
                continue
            u = min(used[i], total - reserved)
            busy = u / total
            # v1 has no 'reserved' field: the driver's own memory is part of 'used'
            memory = MemoryInfo(total, u, reserved, total - reserved - u) if self.memory_api == "v2" else \
                MemoryInfo(total, u + reserved, 0, total - reserved - u)
            out.append(GpuReading(
                index=i, uuid=cfg["uuids"][i], name=cfg["name"], minor=i,
                memory=memory,
                # a simulated GPU has no load of its own: these follow memory
                utilization_pct=0 if not procs[i] else min(100, int(20 + 80 * busy)),
                temperature_c=int(27 + 40 * busy),
                power_w=round(34.0 + 450.0 * busy, 1),
                power_limit_w=600.0,
                pstate="P8" if not procs[i] else "P0",
                processes=sorted(procs[i].values()),
                error=None,
            ))
        return out

    def host_memory(self) -> HostMemory | None:
        total, available = self.host.host_memory()
        return HostMemory(total, available)

    # the simulated driver's checkpoint API: gpuslate.gpu.simhost.checkpoint
    def checkpoint_state(self, pid: int) -> CheckpointState:
        return SimCheckpoint(self.host).state(pid)

    def checkpoint_lock(self, pid: int, *, timeout_ms: int = 0) -> None:
        SimCheckpoint(self.host).lock(pid, timeout_ms)

    def checkpoint(self, pid: int) -> None:
        SimCheckpoint(self.host).checkpoint(pid)

    def checkpoint_restore(self, pid: int) -> None:
        SimCheckpoint(self.host).restore(pid)

    def checkpoint_unlock(self, pid: int) -> None:
        SimCheckpoint(self.host).unlock(pid)

    def close(self) -> None:
        pass
