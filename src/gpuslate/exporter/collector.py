"""One scrape: a fresh reading of the host, bounded in time, as Prometheus metric families.

The host context (:class:`~gpuslate.host.session.HostContext`: the backend,
NVML or a simulated host, its state folder and audit log) is opened once and
held for the exporter's life; every scrape takes one new reading — the ``status`` snapshot
(:func:`~gpuslate.host.snapshot.take_snapshot`, whose ``root_pid`` is the job
rule's root), the units as ``ps`` classifies them, what the audit log gained —
never a cached one. The reading runs in a worker thread: a scrape that waits
longer than ``timeout`` (a driver call stuck in the kernel) answers at once
with the exporter's own metrics and an error counted, not a hang; while that
reading is still stuck, later scrapes answer the same way instead of queueing
behind it. Scrapes that arrive together take their turns.

The metric names, types, labels and help texts are in :data:`METRICS`, the one
list that docs/exporter.md documents and the dashboard test checks against.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from enum import Enum
from typing import Any, NamedTuple

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from .. import __version__
from ..gpu.types import ProcessKind
from ..host.audit import of_host
from ..host.session import HostContext
from ..host.snapshot import take_snapshot
from ..proc.procfs import read_info, read_stat
from ..units.front import Front
from ..units.frontreport import FrontState
from ..units.listing import list_units
from ..units.state import UnitState
from .auditlog import AuditCounts, AuditTail
from .model import Account, Facts, FrontRow, UnitRow, account, label


class Kind(str, Enum):
    GAUGE = "gauge"
    COUNTER = "counter"


GAUGE, COUNTER = Kind.GAUGE, Kind.COUNTER


class Stage(str, Enum):
    """A part of a scrape whose failure is counted (``gpuslate_exporter_scrape_errors_total{stage}``)."""

    READING = "reading"  # the driver (or the simulated host) failed
    TIMEOUT = "timeout"  # over the time bound, or an earlier reading still stuck
    UNITS = "units"  # the units could not be listed (state folder)
    AUDIT = "audit"  # the audit log could not be read


class Spec(NamedTuple):
    type: Kind
    help: str
    labels: tuple[str, ...]


_G = ("gpu",)
#: a process's series by what survives a restart; its info series adds who it is now (see model.ProcessRow)
_PROCESS = ("gpu", "unit", "user", "slot")
_PROCESS_INFO = (*_PROCESS, "pid", "kind", "command", "job_pid", "job_command", "orphaned", "mps_server")
_U = ("unit",)

#: every metric the exporter serves (counters without their ``_total`` suffix)
METRICS: dict[str, Spec] = {
    "gpuslate_gpu_info": Spec(GAUGE, "Always 1: the GPU's UUID and model name.", ("gpu", "uuid", "name")),
    "gpuslate_gpu_memory_total_bytes": Spec(GAUGE, "GPU memory in total.", _G),
    "gpuslate_gpu_memory_used_bytes": Spec(GAUGE, "GPU memory in use (without driver-reserved memory on R510+ "
                                                  "drivers).", _G),
    "gpuslate_gpu_memory_reserved_bytes": Spec(GAUGE, "GPU memory the driver reserves for itself.", _G),
    "gpuslate_gpu_utilization_ratio": Spec(GAUGE, "Share of the last sample period a kernel ran (0 to 1).", _G),
    "gpuslate_gpu_temperature_celsius": Spec(GAUGE, "GPU core temperature.", _G),
    "gpuslate_gpu_power_watts": Spec(GAUGE, "Power drawn.", _G),
    "gpuslate_gpu_power_limit_watts": Spec(GAUGE, "Power limit.", _G),
    "gpuslate_gpu_pstate": Spec(GAUGE, "Performance state: 0 (P0, most performance) to 15.", _G),
    "gpuslate_gpu_read_error": Spec(GAUGE, "1 when an essential query of the GPU failed: its state is unknown.", _G),
    "gpuslate_gpu_memory_holders": Spec(GAUGE, "Processes with a context (memory) on the GPU.", _G),
    "gpuslate_gpu_handle_holders": Spec(GAUGE, "Processes that only hold the GPU's device file open.", _G),
    "gpuslate_gpu_leaked_memory_bytes": Spec(GAUGE, "Memory in use that no listed process holds (leaked or "
                                                    "orphaned contexts, teardown in progress).", _G),
    "gpuslate_gpu_orphaned_memory_bytes": Spec(GAUGE, "Memory held by processes whose launcher (process group "
                                                      "leader) has exited.", _G),
    "gpuslate_gpu_orphaned_processes": Spec(GAUGE, "Processes holding memory whose launcher has exited.", _G),
    "gpuslate_gpu_daemon_memory_bytes": Spec(GAUGE, "Memory spared GPU daemons hold (an idle MPS server): the "
                                                    "host's baseline, not counted as used by wait and clear.", _G),
    "gpuslate_gpu_free": Spec(GAUGE, "1 when the GPU is free as 'gpuslate wait --free' sees it with the default "
                                     "--max-used, else 0.", _G),
    "gpuslate_process_memory_bytes": Spec(GAUGE, "GPU memory one process holds on one GPU, by what survives a "
                                                 "restart (its unit or user and its slot there); "
                                                 "gpuslate_process_info names the process.", _PROCESS),
    "gpuslate_process_info": Spec(GAUGE, "Always 1: the process in a slot of gpuslate_process_memory_bytes: pid, "
                                         "kind, command, its job (the root by gpuslate's job rule) and whether "
                                         "its launcher exited.", _PROCESS_INFO),
    "gpuslate_unit_state": Spec(GAUGE, "1 for the managed unit's current state (as gpuslate ps shows it), "
                                       "0 for the others.", ("unit", "state")),
    "gpuslate_unit_ready": Spec(GAUGE, "1 when the managed unit is ready.", _U),
    "gpuslate_unit_uptime_seconds": Spec(GAUGE, "Seconds since the unit's main process started.", _U),
    "gpuslate_unit_launch_time_seconds": Spec(GAUGE, "When the unit was last launched (Unix time); "
                                                     "changes() counts restarts and swaps.", _U),
    "gpuslate_unit_time_to_ready_seconds": Spec(GAUGE, "Seconds the unit took to become ready at its last "
                                                       "launch.", _U),
    "gpuslate_unit_memory_bytes": Spec(GAUGE, "GPU memory the unit's processes hold on its GPUs.", _U),
    "gpuslate_unit_processes": Spec(GAUGE, "Live processes of the unit.", _U),
    "gpuslate_unit_stops": Spec(COUNTER, "gpuslate runs that signaled the unit's processes, by action (down, "
                                         "also in swap; up-failed; up-interrupted), from the audit log.",
                                ("unit", "action")),
    "gpuslate_front_serving": Spec(GAUGE, "1 when the unit's front routes to it (0: holding, refusing, "
                                          "stranded or down: gpuslate ps says why).", ("front", "unit")),
    "gpuslate_front_held_requests": Spec(GAUGE, "Requests the front holds now (waiting for a swap to finish).",
                                         ("front",)),
    "gpuslate_front_last_swap_held_requests": Spec(GAUGE, "Requests the front held during its last swap or "
                                                          "restart.", ("front",)),
    "gpuslate_front_last_swap_longest_hold_seconds": Spec(GAUGE, "The longest a request waited in the front "
                                                                 "during its last swap or restart.", ("front",)),
    "gpuslate_front_last_swap_cut_requests": Spec(GAUGE, "Requests cut at the drain timeout of the front's last "
                                                         "swap or restart.", ("front",)),
    "gpuslate_clear_runs": Spec(COUNTER, "gpuslate clear runs that sent signals, from the audit log.", ()),
    "gpuslate_signals": Spec(COUNTER, "Signals gpuslate sent, by action and signal, from the audit log.",
                             ("action", "signal")),
    "gpuslate_signal_outcomes": Spec(COUNTER, "Outcomes of signals gpuslate sent (delivered, not_running, "
                                              "pid_reused, permission_denied, error), from the audit log.",
                                     ("action", "signal", "outcome")),
    "gpuslate_exporter_info": Spec(GAUGE, "Always 1: the exporter's version and backend.",
                                   ("version", "backend", "driver_version", "memory_api")),
    "gpuslate_exporter_scrapes": Spec(COUNTER, "Scrapes answered.", ()),
    "gpuslate_exporter_scrape_errors": Spec(COUNTER, "Scrapes whose reading failed, by stage (reading, timeout, "
                                                     "units, audit).", ("stage",)),
    "gpuslate_exporter_reading_ok": Spec(GAUGE, "1 when this scrape's reading of the GPUs succeeded in time; "
                                                "0: the GPU and process series are missing.", ()),
    "gpuslate_exporter_scrape_duration_seconds": Spec(GAUGE, "Seconds this scrape took to read the host.", ()),
}


class Reading(NamedTuple):
    facts: Facts | None
    failed: tuple[Stage, ...]


def gather_facts(host: HostContext, *, with_units: bool = True) -> tuple[Facts, bool]:
    """One snapshot of ``host`` and the facts :func:`~.model.account` needs; the bool says whether
    the units could be listed (a broken state folder must not hide the GPUs)."""
    snap = take_snapshot(host.backend)
    holders = [p for g in snap.gpus for p in g.processes if p.kind != ProcessKind.HANDLE and p.visible]
    leaders: dict[int, bool] = {}
    for p in holders:
        if p.pgid is not None and p.pgid != p.pid and p.pgid not in leaders:
            st = read_stat(p.pgid)  # a pid reused since by a process outside the group leads nothing
            leaders[p.pgid] = st is not None and not st.has_exited and st.pgid == p.pgid
    commands = {p.pid: p.command for g in snap.gpus for p in g.processes if p.command is not None}
    for root in {p.root_pid for p in holders} - commands.keys():
        info = read_info(root)  # a launcher that holds no GPU itself
        if info is not None:
            commands[root] = info.command
    units: list[UnitRow] = []
    unit_of: dict[int, str] = {}
    units_ok = True
    if with_units:
        try:
            for u in list_units(host).units:
                rec = u.record
                units.append(UnitRow(u.unit.name, u.state, u.uptime_s, rec.launched_at if rec else None,
                                     rec.time_to_ready_s if rec else None, u.gpu_memory, len(u.processes)))
                unit_of.update(dict.fromkeys(u.processes, u.unit.name))
        except Exception:  # noqa: BLE001 - a broken state folder is counted (stage units), never a failed scrape
            units_ok = False
    fronts: list[FrontRow] = []
    if with_units and units_ok:
        try:
            fronts = [_front_row(f) for f in Front.all(host)]
        except Exception:  # noqa: BLE001 - as the units: counted (stage units), never a failed scrape
            units_ok = False
    return Facts(snap, leaders, commands, unit_of, units, host.max_used(None), fronts), units_ok


def _front_row(f: Front) -> FrontRow:
    state, _ = f.live()
    now = f.counters_now() if state not in (FrontState.DOWN, FrontState.STOPPED) else None
    last = f.record.last_swap or {}
    hold: dict[str, Any] = last["hold"] if isinstance(last.get("hold"), dict) else {}
    drain: dict[str, Any] = last["drain"] if isinstance(last.get("drain"), dict) else {}

    def num(d: dict[str, Any], key: str) -> float | None:
        v = d.get(key)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    held, longest, cut = num(hold, "held"), num(hold, "longest_hold_s"), num(drain, "cut")
    return FrontRow(f.record.address, f.record.unit, state.value, now[0] if now else None,
                    int(held) if held is not None else None, longest, int(cut) if cut is not None else None)


class _Slot:
    """One job for the worker: what to run, its result, and when it is done."""

    def __init__(self, fn: Callable[[], Reading]) -> None:
        self.fn = fn
        self.result: Reading | None = None
        self.done = threading.Event()


class _Worker:
    """One long-lived thread that takes the readings (a thread per scrape would churn the
    allocator's per-thread arenas). A job that overruns its wait keeps the worker busy; while
    it is, :meth:`run` answers ``None`` at once instead of queueing behind it."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Slot] = queue.SimpleQueue()
        self._busy = False  # set by run(), cleared by the worker when the job ends
        # started by the first job, on the thread of the first scrape: it inherits that thread's
        # signal mask (the CLI leaves SIGTERM and SIGINT to its main thread)
        self._thread = threading.Thread(target=self._loop, name="gpuslate-exporter-reading", daemon=True)

    def run(self, fn: Callable[[], Reading], timeout: float) -> Reading | None:
        """``fn()`` on the worker, awaited up to ``timeout`` seconds; None when it overran, or when
        an earlier job is still running (callers take turns: one caller at a time)."""
        if self._busy:
            return None
        slot = _Slot(fn)
        self._busy = True
        if self._thread.ident is None:
            self._thread.start()
        self._jobs.put(slot)
        return slot.result if slot.done.wait(max(0.0, timeout)) else None

    def _loop(self) -> None:
        while True:
            slot = self._jobs.get()
            try:
                slot.result = slot.fn()
            except Exception:  # noqa: BLE001 - fn counts its own failures; anything else must not end the worker
                slot.result = None
            finally:
                self._busy = False
                slot.done.set()


class GpuslateCollector(Collector):
    """The exporter's collector, for a private :class:`~prometheus_client.CollectorRegistry`."""

    def __init__(self, host: HostContext, *, timeout: float = 5.0, audit: AuditTail | None = None,
                 with_units: bool = True) -> None:
        self.host = host
        self.timeout = timeout
        self.audit = audit
        self.with_units = with_units
        self._turn = threading.Lock()  # one scrape reads at a time
        self._worker = _Worker()
        self._errors: Counter[Stage] = Counter()
        self._scrapes = 0
        #: the labels of gpuslate_exporter_info, as the last reading found them
        self._info: tuple[str, ...] = (__version__, host.name, "", "")

    def describe(self) -> Iterable[Metric]:
        return []  # registering must not take a reading

    def collect(self) -> Iterator[Metric]:
        t0 = time.monotonic()
        if self._turn.acquire(timeout=self.timeout):
            try:
                reading = self._read(t0 + self.timeout)
                self._scrapes += 1
                self._errors.update(reading.failed)
                # after a timeout the stuck reading may still be changing the counts: not shown then
                audit = self.audit.counts if self.audit is not None and Stage.TIMEOUT not in reading.failed else None
                families = list(self._families(reading, audit, time.monotonic() - t0))
            finally:
                self._turn.release()
        else:  # earlier scrapes took the whole time: answer, do not queue
            self._errors[Stage.TIMEOUT] += 1
            families = list(self._families(Reading(None, (Stage.TIMEOUT,)), None, time.monotonic() - t0))
        yield from families

    def _read(self, deadline: float) -> Reading:
        """The facts, read by the worker thread and awaited until ``deadline``."""
        reading = self._worker.run(self._gather, deadline - time.monotonic())
        return reading if reading is not None else Reading(None, (Stage.TIMEOUT,))

    def _gather(self) -> Reading:
        failed: list[Stage] = []
        facts: Facts | None = None
        try:
            facts, units_ok = gather_facts(self.host, with_units=self.with_units)
            if not units_ok:
                failed.append(Stage.UNITS)
            # asked here, inside the time bound: NVML's memory API is a driver query on first use
            backend = self.host.backend
            self._info = (__version__, backend.name, label(facts.snapshot.driver_version), backend.memory_api)
        except Exception:  # noqa: BLE001 - the driver failed: counted, the scrape still answers
            failed.append(Stage.READING)
        if self.audit is not None:
            try:
                self.audit.update()
            except Exception:  # noqa: BLE001 - an unreadable audit log: counted, the GPUs still shown
                failed.append(Stage.AUDIT)
        return Reading(facts, tuple(failed))

    def _families(self, reading: Reading, audit: AuditCounts | None, elapsed: float) -> Iterator[Metric]:
        yield _family("gpuslate_exporter_info", [(self._info, 1)])
        if reading.facts is not None:
            yield from _host_families(reading.facts, account(reading.facts))
        if audit is not None:
            yield from _audit_families(audit)
        yield _family("gpuslate_exporter_scrapes", [((), self._scrapes)])
        yield _family("gpuslate_exporter_scrape_errors", [((s.value,), self._errors[s]) for s in Stage])
        yield _family("gpuslate_exporter_reading_ok", [((), 0 if reading.facts is None else 1)])
        yield _family("gpuslate_exporter_scrape_duration_seconds", [((), elapsed)])


Sample = tuple[tuple[object, ...], float]


def _family(name: str, samples: Iterable[Sample]) -> Metric:
    spec = METRICS[name]
    cls = GaugeMetricFamily if spec.type == GAUGE else CounterMetricFamily
    fam = cls(name, spec.help, labels=spec.labels)
    for labels, value in samples:
        fam.add_metric([str(v) for v in labels], value)
    return fam


def _pstate(text: str | None) -> int | None:
    if text and text[0] == "P" and text[1:].isdigit():
        return int(text[1:])
    return None


def _host_families(facts: Facts, acc: Account) -> Iterator[Metric]:
    readings = [g.reading for g in facts.snapshot.gpus]

    def per_gpu(name: str, values: Iterable[tuple[int, float | None]]) -> Metric:
        return _family(name, [((gpu,), v) for gpu, v in values if v is not None])

    yield _family("gpuslate_gpu_info", [((r.index, label(r.uuid), label(r.name)), 1) for r in readings])
    for name, field in (("total", "total"), ("used", "used"), ("reserved", "reserved")):
        yield per_gpu(f"gpuslate_gpu_memory_{name}_bytes",
                      ((r.index, getattr(r.memory, field) if r.memory else None) for r in readings))
    yield per_gpu("gpuslate_gpu_utilization_ratio",
                  ((r.index, r.utilization_pct / 100 if r.utilization_pct is not None else None) for r in readings))
    yield per_gpu("gpuslate_gpu_temperature_celsius", ((r.index, r.temperature_c) for r in readings))
    yield per_gpu("gpuslate_gpu_power_watts", ((r.index, r.power_w) for r in readings))
    yield per_gpu("gpuslate_gpu_power_limit_watts", ((r.index, r.power_limit_w) for r in readings))
    yield per_gpu("gpuslate_gpu_pstate", ((r.index, _pstate(r.pstate)) for r in readings))
    yield per_gpu("gpuslate_gpu_read_error", ((r.index, 1 if r.error else 0) for r in readings))
    yield per_gpu("gpuslate_gpu_memory_holders", ((g.gpu, g.memory_holders) for g in acc.gpus))
    yield per_gpu("gpuslate_gpu_handle_holders", ((g.gpu, g.handle_holders) for g in acc.gpus))
    yield per_gpu("gpuslate_gpu_leaked_memory_bytes", ((g.gpu, g.leaked) for g in acc.gpus))
    yield per_gpu("gpuslate_gpu_orphaned_memory_bytes", ((g.gpu, g.orphaned) for g in acc.gpus))
    yield per_gpu("gpuslate_gpu_orphaned_processes", ((g.gpu, g.orphaned_processes) for g in acc.gpus))
    yield per_gpu("gpuslate_gpu_daemon_memory_bytes", ((g.gpu, g.daemon_memory) for g in acc.gpus))
    yield per_gpu("gpuslate_gpu_free", ((g.gpu, None if g.free is None else int(g.free)) for g in acc.gpus))
    yield _family("gpuslate_process_memory_bytes", [((p.gpu, p.unit, p.user, p.slot), p.bytes) for p in acc.processes])
    yield _family("gpuslate_process_info", [
        ((p.gpu, p.unit, p.user, p.slot, p.pid, p.kind, p.command, p.job_pid, p.job_command, str(p.orphaned).lower(),
          p.mps_server),
         1) for p in acc.processes])
    units = facts.units
    yield _family("gpuslate_unit_state", [((label(u.name), s.value), 1 if u.state == s else 0)
                                          for u in units for s in UnitState])
    yield _family("gpuslate_unit_ready", [((label(u.name),), 1 if u.state == UnitState.READY else 0) for u in units])
    for name, attr in (("uptime_seconds", "uptime_s"), ("launch_time_seconds", "launched_at"),
                       ("time_to_ready_seconds", "time_to_ready_s"), ("memory_bytes", "memory"),
                       ("processes", "processes")):
        yield _family(f"gpuslate_unit_{name}", [((label(u.name),), getattr(u, attr)) for u in units
                                                 if getattr(u, attr) is not None])
    yield from _front_families(facts.fronts)


def _front_families(fronts: Sequence[FrontRow]) -> Iterator[Metric]:
    yield _family("gpuslate_front_serving", [((label(f.address), label(f.unit or "")), 1 if f.state == "serving" else 0)
                                             for f in fronts])
    for name, attr in (("held_requests", "held_now"), ("last_swap_held_requests", "last_held"),
                       ("last_swap_longest_hold_seconds", "last_longest_hold_s"),
                       ("last_swap_cut_requests", "last_cut")):
        yield _family(f"gpuslate_front_{name}", [((label(f.address),), getattr(f, attr)) for f in fronts
                                                  if getattr(f, attr) is not None])


def _audit_families(c: AuditCounts) -> Iterator[Metric]:
    yield _family("gpuslate_clear_runs", [((), len(c.clear_runs))])
    yield _family("gpuslate_signals", [(k, n) for k, n in sorted(c.signals.items())])
    yield _family("gpuslate_signal_outcomes", [(k, n) for k, n in sorted(c.outcomes.items())])
    yield _family("gpuslate_unit_stops", [(k, len(runs)) for k, runs in sorted(c.unit_stops.items())])


def registry_for(host: HostContext, *, timeout: float = 5.0, audit: bool = True) -> CollectorRegistry:
    """A private registry holding only the exporter's collector for ``host``, which the caller keeps
    open for as long as the registry serves; with ``audit``, the counts of ``host``'s audit log
    (its simulated host's own, or the driver's)."""
    tail = None
    if audit:
        log = host.audit_log
        tail = AuditTail(log.path, of_host(log.sim_root))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuslateCollector(host, timeout=timeout, audit=tail))
    return registry
