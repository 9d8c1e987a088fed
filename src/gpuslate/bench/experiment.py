"""``experiment run``: sweep each deployment on a verified clean slate, one point at a time.

The run is a sequence of *blocks*, one deployment each (:func:`schedule`):
with the default interleaved order, repeat after repeat, every deployment in
an order rotated by one each repeat (ABC, BCA, CAB), so that drift of the
machine over the run cannot masquerade as a difference between deployments;
with the blocked order, each deployment's repeats back to back and then a
control block re-measuring the first deployment at one level. For each block:

1. bring its deployment up through the units API: ``swap`` from the one
   serving (down, verify its GPUs released, up, ready; with ``switch = "park"``,
   ``swap --park``: the one serving parked, the next resumed if it is parked,
   both kept resident), or ``up`` for the first one (``clear`` first when the
   spec says so); the result is recorded in ``DIR/transitions/``, and how the
   switch went (its method and time) in every point of the block;
2. sweep the block's levels with :func:`run_bench`, one single-level plan per
   *point*, each warmed up at its own concurrency (requests not counted);
3. write every finished point at once to ``DIR/points/`` (temp file + rename):
   the figures, its place in the run's order, the deployment's command line,
   the GPU state just before the point, gpuslate's version and the engine's
   as the server reports it.

The whole run goes through one :class:`~gpuslate.api.Host`, the caller's: one
backend, one state folder and one audit log for every ``up``, ``swap``,
``down`` and GPU reading of the experiment, its progress lines to the host's
event sink.

With ``[experiment] verify = N``, once every point has run the report's
summary is made (no plots), and if it recommends a threshold that its
engine can apply (:mod:`.engines`), the run goes on with that
recommendation's own deployment: the speculative deployment with the
written configuration (its files written to DIR first), fixed in
``DIR/verification.json`` so that ``--resume`` runs the same one. N more
repeats, interleaved, of it and of the deployment that won at each level
(both where they tied); their points are marked ``verify``.

The last deployment is stopped at the end (and its GPUs verified free). An
interrupt (Ctrl-C, or SIGTERM turned into one by the CLI) stops every unit
this run started, verifies the GPUs, and raises :class:`Interrupted`; the
points already written stay, and ``resume=True`` skips them.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from .. import __version__
from .._time import iso_time
from .._walk import write_file
from ..api import Host
from ..errors import Interrupted, NotDoneError, ServerFailed, UsageError
from ..options import SwapOptions
from ..unitname import is_unit_name
from ..units import UnitSpec, UnitState, UpOptions
from .plan import LoadPlan
from .report import ENGINE_FILES, build_summary, plan_verification, recorded_files
from .result import Progress
from .rundir import POINT_SCHEMA, RUN_SCHEMA, VERIFY_FILE, load_verification, read_json, write_json_atomic
from .spec import RECOMMENDED, Deployment, ExperimentSpec, Order, same_experiment, unit_namespace

__all__ = ["POINT_SCHEMA", "RUN_SCHEMA", "PointKey", "RunResult", "run_experiment", "schedule", "write_json_atomic"]
Phase = Literal["starting", "warmup", "running", "finished"]
Note = Callable[[str], None]


@dataclass(frozen=True)
class PointKey:
    deployment: str
    concurrency: int
    repeat: int
    control: bool = False  # the blocked order's drift control, measured after every block
    verify: bool = False  # the recommendation's own run (repeat: of the verification)

    @property
    def filename(self) -> str:
        tail = ("__control" if self.control else "") + ("__verify" if self.verify else "")
        return f"{self.deployment}__c{self.concurrency:05d}__r{self.repeat:02d}{tail}.json"


@dataclass(frozen=True)
class Block:
    """Points of one deployment run back to back (one bring-up)."""

    deployment: Deployment
    keys: tuple[PointKey, ...]


@dataclass(frozen=True)
class ExperimentProgress:
    """Where a run stands; passed to ``on_progress`` often (each request end)."""

    deployment: str
    deployment_index: int
    deployments: int
    phase: Phase
    concurrency: int | None
    repeat: int | None
    done: int  # requests of the current point
    total: int | None
    points_done: int  # finished points, resumed ones included
    points_total: int
    elapsed_s: float
    remaining_s: float | None  # estimate from the points timed in this run
    eta_at: float | None = None  # time.monotonic() when the run should end (a display counts down to it)
    control: bool = False
    output_tok_s: float | None = None  # phase "finished": the point's output throughput (as measured)
    #: points_total holds an estimate of the verification's points, not planned yet (see verify_estimate)
    total_estimated: bool = False


@dataclass
class RunResult:
    out_dir: str
    points_run: int
    points_skipped: int
    transitions: list[dict[str, Any]] = field(default_factory=list)
    elapsed_s: float = 0.0


def point_keys(spec: ExperimentSpec, dep: Deployment) -> list[PointKey]:
    """A deployment's measured points (controls aside): every level once per repeat."""
    return [PointKey(dep.name, c, r) for r in range(spec.repeats) for c in spec.levels]


def verify_estimate(spec: ExperimentSpec) -> int:
    """The verification's points before it is planned (its plan needs the sweep's figures): per
    repeat, the recommendation at every level, at each the deployment that won it, and the other
    one across the switch (T, T+1 and the level above: three more, where the winner is one of the
    two; a tie adds one): twice the levels and three. Counted in the run's total from the start, so
    that the time left includes the phase (exact once it is planned; dropped when nothing is)."""
    return (2 * len(spec.levels) + 3) * spec.verify


def schedule(spec: ExperimentSpec) -> list[Block]:
    """The run's blocks in order. Interleaved: repeat r sweeps the deployments rotated by r.
    Blocked: each deployment's repeats in one block, then the first deployment's control level
    again (the drift control)."""
    deps = list(spec.deployments)
    if spec.order is Order.INTERLEAVED:
        blocks = []
        for r in range(spec.repeats):
            k = r % len(deps)
            for dep in deps[k:] + deps[:k]:
                blocks.append(Block(dep, tuple(PointKey(dep.name, c, r) for c in spec.levels)))
        return blocks
    blocks = [Block(dep, tuple(point_keys(spec, dep))) for dep in deps]
    assert spec.control_level is not None
    first = deps[0]
    blocks.append(Block(first, (PointKey(first.name, spec.control_level, spec.repeats, control=True),)))
    return blocks


def plan_for(spec: ExperimentSpec, key: PointKey, *, warmup: int = 0) -> LoadPlan:
    """The one-level plan of a point; the seed differs per repeat and is the same on every run."""
    kw = dict(spec.load)
    kw.pop("warmup", None)
    key_env = kw.pop("api_key_env", None)  # the key itself is never in the spec, the run folder or a point
    if key_env:
        kw["api_key"] = os.environ.get(key_env) or None
    # a control repeats the first repeat's requests exactly: only the machine may have changed
    seed = spec.load.get("seed", 0) + (0 if key.control else key.repeat)
    return LoadPlan(concurrency=(key.concurrency,), seed=seed, warmup=warmup,
                    **{k: v for k, v in kw.items() if k != "seed"})


def verification_blocks(plan: dict[str, Any], deployments: dict[str, Deployment], repeats: int) -> list[Block]:
    """The verification's blocks: ``repeats`` repeats of the recommendation and of the deployments
    it is compared with, each at its levels; the order rotated each repeat (baseline, speculative,
    recommended first: the phase before it ends on one of the first two)."""
    order = [n for n in plan["order"] if plan["levels"].get(n)]
    blocks = []
    for r in range(repeats):
        k = r % len(order)
        for name in order[k:] + order[:k]:
            blocks.append(Block(deployments[name], tuple(PointKey(name, c, r, verify=True)
                                                         for c in plan["levels"][name])))
    return blocks


def prepare_dir(spec: ExperimentSpec, out: Path, resume: bool) -> None:
    """Create DIR with the run manifest, or check it belongs to this spec when resuming."""
    manifest = out / "experiment.json"
    if manifest.is_file():
        if not resume:
            raise UsageError(f"{out} already holds an experiment",
                             hint="add --resume to continue it, or give another --out DIR")
        try:
            prev = read_json(manifest)
            if not isinstance(prev, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot read {manifest}: {exc}") from None
        why = same_experiment(spec, prev.get("identity"), prev.get("spec") or {})
        if why is not None:
            raise UsageError(f"{out} holds an experiment with {why}; --resume needs the same spec "
                             "(it may raise [load] repeats and [experiment] verify)", hint="give another --out DIR")
        write_json_atomic(manifest, {**prev, "spec": spec.to_json(), "identity": spec.identity()})
        return
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"{out} exists and is not an experiment folder", hint="give another --out DIR")
    write_file(out / "spec.toml", spec.text.encode(), what="experiment directory")
    write_json_atomic(manifest, {"schema": RUN_SCHEMA, "gpuslate_version": __version__,
                                 "created_at": iso_time(time.time()), "spec": spec.to_json(),
                                 "identity": spec.identity()})


def run_experiment(host: Host, spec: ExperimentSpec, out: str | Path, *, resume: bool = False,
                   on_progress: Callable[[ExperimentProgress], None] | None = None,
                   confirm: Callable[[Any], bool] | None = None) -> RunResult:
    """Run (or resume) the experiment into ``out`` on ``host`` (its lifetime: the caller keeps it
    open and closes it); progress lines go to ``host``'s event sink. See the module docstring.
    ``confirm``: asked with the clear's plan before the spec's ``clear`` signals (as ``up --clear``);
    None: the caller is the consent."""
    out = Path(out)
    prepare_dir(spec, out, resume)
    return _Runner(host, spec, out, on_progress, confirm).run()


#: the states a unit reaches only with its GPUs verified free: down stopped it, or up gave up and cleaned up
_VERIFIED_GONE = (UnitState.STOPPED, UnitState.FAILED)


class _Runner:
    def __init__(self, host: Host, spec: ExperimentSpec, out: Path,
                 on_progress: Callable[[ExperimentProgress], None] | None,
                 confirm: Callable[[Any], bool] | None = None) -> None:
        self.host, self.spec, self.out, self.on_progress = host, spec, out, on_progress
        self.confirm = confirm
        self.note: Note = host.note
        self.points = out / "points"
        self.t0 = time.monotonic()
        self.running: str | None = None  # the unit (NAMESPACE.DEPLOYMENT) this run started and that serves now
        self.touched: list[str] = []  # units this run started: the ones an interrupt may stop
        self.parked: list[str] = []  # units this run parked (switch = "park"): resident, stopped at the end
        self.ports: dict[str, int | None] = {}  # each unit's port, as brought up
        self.switch: dict[str, Any] | None = None  # how the serving deployment came (recorded in its points)
        self.blocks = schedule(spec)
        all_keys = [k for b in self.blocks for k in b.keys]
        self.seq = {k: i for i, k in enumerate(all_keys)}
        self.total = len(all_keys)
        self.done = sum(1 for k in all_keys if (self.points / k.filename).is_file())
        self.pending_verify = verify_estimate(spec)  # until the verification is planned (or skipped)
        self.skipped = self.done
        self.point_seconds: list[float] = []
        self.point_started: float | None = None
        self.result = RunResult(str(out), 0, self.skipped)

    def run(self) -> RunResult:
        try:
            self._sweep(self.blocks)
            if self.spec.verify:
                self._verify()
            if self.running is not None:
                self._stop(self.running, "end of the experiment")
            for name in list(self.parked):
                self._stop(name, "end of the experiment (parked)")
        except BaseException as exc:
            stopped = self._cleanup()
            if isinstance(exc, KeyboardInterrupt):
                raise Interrupted(f"interrupted; {stopped}; {self.done - self.skipped} new point(s) kept in "
                                  f"{self.out}", hint=f"continue with: gpuslate experiment run "
                                  f"{self.spec.path} --out {self.out} --resume") from None
            raise
        self.result.elapsed_s = time.monotonic() - self.t0
        return self.result

    def _sweep(self, blocks: list[Block]) -> None:
        names = [d.name for d in self.spec.deployments]
        for block in blocks:
            dep = block.deployment
            index = names.index(dep.name) if dep.name in names else len(names)
            pending = [k for k in block.keys if not (self.points / k.filename).is_file()]
            if not pending:
                continue
            if self.running != dep.unit.name:
                self._progress(dep, index, "starting", None, None, 0, None)
                self._bring_up(dep)
            for key in pending:
                self._point(dep, index, key, warmup=self.spec.load.get("warmup", 0))

    def _verify(self) -> None:
        """The recommendation's own run (see the module docstring): planned once, then resumed."""
        plan = load_verification(self.out)
        if plan is None:
            summary, _, _ = build_summary(self.out)
            plan, why = plan_verification(summary, self.spec.to_json())
            if plan is None:
                self.pending_verify = 0
                self.note(f"verification skipped: {why}")
                return
            write_json_atomic(self.out / VERIFY_FILE, plan)
            self.note(f"verifying the recommendation: {plan['name']} ({plan['command_line']})")
        unit = _checked_plan(plan, self.out, {d.name for d in self.spec.deployments})
        unit_name = f"{unit_namespace(self.spec.name)}.{plan['name']}"  # the experiment's namespace, as its others
        if not is_unit_name(unit_name):
            raise UsageError(f"the recommendation would run as unit {unit_name!r}, longer than a unit name may be",
                             hint="shorten [experiment] name or the speculative deployment's name")
        unit = replace(unit, name=unit_name)
        for name, text in plan["files"].items():  # the written configuration the deployment runs with
            write_file(self.out / name, text.encode(), what="experiment directory")
        deployments = {d.name: d for d in self.spec.deployments}
        deployments[plan["name"]] = Deployment(plan["name"], RECOMMENDED, unit, str(self.out / VERIFY_FILE))
        blocks = verification_blocks(plan, deployments, self.spec.verify)
        keys = [k for b in blocks for k in b.keys]
        self.seq.update({k: len(self.seq) + i for i, k in enumerate(keys)})
        self.total += len(keys)
        self.pending_verify = 0
        done = sum(1 for k in keys if (self.points / k.filename).is_file())
        self.done += done
        self.skipped += done
        self.result.points_skipped = self.skipped
        self._sweep(blocks)

    # -- deployments ---------------------------------------------------------------

    def _bring_up(self, dep: Deployment) -> None:
        t = time.time()
        for name in [n for n in self.parked if n != dep.unit.name and self.ports.get(n) == dep.unit.port]:
            self._stop(name, f"{dep.unit.name} serves on its port")
        port_of_old = self.ports.get(self.running) if self.running is not None else None
        self.ports[dep.unit.name] = dep.unit.port
        if self.running is not None:
            old = self.running
            # a parked server keeps its port: one that the next deployment takes (the recommendation's own run
            # serves on the speculative deployment's) is stopped instead
            park = self.spec.parks and port_of_old != dep.unit.port
            self.note(f"swap {old} -> {dep.unit.name}" + (" (park)" if park else ""))
            r = self.host.swap(old, dep.unit, SwapOptions(park=park))
            doc = r.to_json()
            if r.parked is not None and r.parked.ok and old not in self.parked:
                self.parked.append(old)
            if r.ok and dep.unit.name in self.parked:
                self.parked.remove(dep.unit.name)
            if r.status != "down_failed":
                self.running = dep.unit.name if r.ok else None  # a failed NEW was stopped by up itself
            self.switch = {"from": old, "method": r.switch if r.ok else None, "seconds": round(r.total_s, 4),
                           "downtime_s": r.downtime_s, "fallback": r.fallback}
        else:
            first_clear = self.spec.clear_first and self.result.transitions == []
            self.note(f"up {dep.unit.name}" + (" (clearing its GPUs first)" if first_clear else ""))
            asked = self.confirm if first_clear else None
            u = self.host.up(dep.unit, UpOptions(clear_first=first_clear, confirm=asked))
            doc = u.to_json()
            if u.ok:
                self.running = dep.unit.name
            self.switch = {"from": None, "method": "start", "seconds": round(u.timings.get("total_s", 0.0), 4),
                           "downtime_s": None, "fallback": None}
        # up/swap clean up a NEW they were interrupted starting; from here on it is ours to stop
        self.touched.append(dep.unit.name)
        self._record({"deployment": dep.name, "action": doc["schema"].split(".")[1], "at": iso_time(t),
                      "ok": doc["ok"], "result": doc})
        if not doc["ok"]:
            what = doc.get("status")
            if what == "down_failed":
                raise NotDoneError(f"could not stop {self.running} cleanly; {dep.name} was not started",
                                   hint=f"see {self.out}/transitions/ and 'gpuslate status'")
            raise ServerFailed(f"deployment {dep.name} did not come up ({what})",
                               hint=f"see {self.out}/transitions/ and 'gpuslate logs {dep.unit.name}'")

    def _stop(self, name: str, why: str) -> dict[str, Any]:
        self.note(f"down {name} ({why})")
        t = time.time()
        d = self.host.down(name)
        doc = d.to_json()
        deployment = next((d.name for d in self.spec.deployments if d.unit.name == name), name)
        self._record({"deployment": deployment, "action": "down", "at": iso_time(t), "ok": d.ok, "result": doc})
        if d.ok:
            if name == self.running:
                self.running = None
            if name in self.parked:
                self.parked.remove(name)
            return doc
        raise NotDoneError(f"could not stop {name} cleanly: GPUs not verified free",
                           hint=f"see {self.out}/transitions/ and 'gpuslate status'")

    def _cleanup(self) -> str:
        """After an error or interrupt: stop every unit this run touched that still has processes
        (an interrupted swap may leave the old one half-stopped) or that no down saw stopped (a stop
        cut short after its signals: its processes gone, its GPUs not yet verified free), with
        further signals held off."""
        stopped, failed = [], []
        with _signals_held():
            live = {u.unit.name for u in self.host.ps().units  # a corrupt record has a name too
                    if u.processes or u.state not in _VERIFIED_GONE}
            for name in dict.fromkeys(reversed(self.touched)):
                if name not in live:
                    continue
                try:
                    self._stop(name, "interrupted")
                    stopped.append(name)
                except BaseException as exc:  # noqa: BLE001 - reported, never masking the original error
                    failed.append(f"stopping {name} failed: {exc}")
        self.running = None
        self.parked.clear()
        if failed:
            return "; ".join(failed)
        return (f"{', '.join(stopped)} stopped and GPUs verified free" if stopped else "nothing was running")

    def _record(self, doc: dict[str, Any]) -> None:
        self.result.transitions.append(doc)
        n = len(list((self.out / "transitions").glob("*.json"))) if (self.out / "transitions").is_dir() else 0
        write_json_atomic(self.out / "transitions" / f"{n:03d}-{doc['deployment']}-{doc['action']}.json", doc)

    # -- points --------------------------------------------------------------------

    def _point(self, dep: Deployment, index: int, key: PointKey, warmup: int) -> None:
        before = self.host.status().to_json()
        plan = plan_for(self.spec, key, warmup=warmup)
        t_start, started_at = time.monotonic(), iso_time(time.time())
        self.point_started = t_start

        def progress(p: Progress) -> None:
            self._progress(dep, index, "warmup" if p.warmup else "running", key.concurrency, key.repeat,
                           p.done, p.total, control=key.control)

        self._progress(dep, index, "warmup" if warmup else "running", key.concurrency, key.repeat, 0,
                       plan.requests, control=key.control)
        from .loadgen import run_bench  # lazy: optional (aiohttp: reports read points without it)

        bench = run_bench(dep.unit.url(""), plan, on_progress=progress)
        doc = bench.to_json()
        if not bench.levels:
            raise ServerFailed(f"{dep.name} at concurrency {key.concurrency}: no result")
        point = {
            "schema": POINT_SCHEMA, "experiment": self.spec.name, "deployment": dep.name, "role": dep.role,
            "concurrency": key.concurrency, "repeat": key.repeat, "control": key.control, "verify": key.verify,
            "seq": self.seq[key], "order": self.spec.order.value, "seed": plan.seed,
            "command": dep.unit.command, "unit": dep.unit.to_json(), "gpuslate_version": __version__,
            "engine": doc.get("server", {}), "started_at": started_at, "finished_at": iso_time(time.time()),
            "gpu_state_before": before, "level": doc["levels"][0], "bench": doc,
            # the files its command names (an options file), as they were: the report reads what ran
            "engine_files": recorded_files(dep.unit.command, dep.unit.cwd),
            # how this deployment came to serve before its block: started, restarted, or resumed from a park
            "switch": self.switch,
        }
        write_json_atomic(self.points / key.filename, point)
        self.point_seconds.append(time.monotonic() - t_start)
        self.done += 1
        self.result.points_run += 1
        self.point_started = None
        self._progress(dep, index, "finished", key.concurrency, key.repeat, doc["levels"][0]["completed"],
                       plan.requests, control=key.control, output_tok_s=doc["levels"][0]["output_token_throughput"])

    def _progress(self, dep: Deployment, index: int, phase: Phase, concurrency: int | None,
                  repeat: int | None, done: int, total: int | None, *, control: bool = False,
                  output_tok_s: float | None = None) -> None:
        if self.on_progress is None:
            return
        now = time.monotonic()
        total = self.total + self.pending_verify
        left = total - self.done
        remaining = None
        if self.point_seconds:  # the mean point so far, less what the current one has already run
            mean = sum(self.point_seconds) / len(self.point_seconds)
            into = min(now - self.point_started, mean) if self.point_started is not None else 0.0
            remaining = max(0.0, mean * left - into)
        self.on_progress(ExperimentProgress(dep.name, index, len(self.spec.deployments) + (index >= len(
            self.spec.deployments)), phase, concurrency,
                                            repeat, done, total, self.done, self.total + self.pending_verify,
                                            now - self.t0, remaining, None if remaining is None else now + remaining,
                                            control, output_tok_s, total_estimated=self.pending_verify > 0))


def _checked_plan(plan: dict[str, Any], out: Path, names: set[str]) -> UnitSpec:
    """``DIR/verification.json`` as this module wrote it, or a UsageError: its files only the engine
    files a report writes (names, never paths: they are written into DIR), its levels lists of
    integers for the spec's deployments and its own, its unit a valid one."""
    bad = UsageError(f"{out / VERIFY_FILE} is not one gpuslate wrote", hint="remove it, then --resume")
    try:
        files, levels, order = plan["files"], plan["levels"], plan["order"]
        ok = (isinstance(files, dict) and set(files) <= set(ENGINE_FILES)
              and all(isinstance(t, str) for t in files.values())
              and isinstance(order, list) and set(order) <= names | {plan["name"]} and plan["name"] in order
              and isinstance(levels, dict) and set(levels) <= set(order)
              and all(isinstance(v, list) and all(isinstance(c, int) and not isinstance(c, bool) for c in v)
                      for v in [*levels.values(), plan.get("switch_levels") or []]))
        if not ok or plan["name"] in names:
            raise bad
        return UnitSpec.from_json({**plan["unit"], "name": plan["name"]}).validate()
    except (KeyError, TypeError, AttributeError):
        raise bad from None


@contextmanager
def _signals_held() -> Iterator[None]:
    """Ignore SIGINT/SIGTERM while stopping servers, so a second Ctrl-C cannot leave one half-stopped.
    Only the main thread may change signal handlers; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
