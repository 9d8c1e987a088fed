"""``experiment report DIR``: aggregate the points, recommend a threshold, write the report.

Reads ``DIR/experiment.json`` and ``DIR/points/*.json`` (nothing else), and
writes ``summary.json`` (the ``gpuslate.experiment.v1`` document),
``summary.csv``, the PNG plots (through :mod:`gpuslate.bench.plots`, the only
module that imports matplotlib) and ``report.md`` embedding them.

Figures of a repeat are aggregated per deployment and level: output
throughput as mean, min and max over the repeats (the spread the threshold
needs); latency statistics as the mean of each repeat's statistic. With
``time_scale`` S in the spec (simulated servers run S times faster than
modelled) throughputs are divided by S and latencies multiplied by S, so the
report shows the modelled system ("modelled time": the one wording used for
this everywhere); the raw figures stay in the points.

Drift: the machine may get slower or faster during a run (another job
starts). With the interleaved order every repeat sweeps every deployment, so
the drift is the change between repeats that all deployments share
(:func:`measure_drift`), and each deployment's repeats, measured at different
times, carry it in their spread; with the blocked order it is the control
point's change from the first measurement of the same level, added to the
intervals. Every comparison is a ratio with an interval (the repeats' spread,
plus a blocked run's drift); a difference inside it is printed as "no
detectable difference".

The recommendation in the speculative deployment's own terms (files and
command line, blockers, versions: :mod:`.engines`) is ``recommendation.apply``;
the engine files are written only when it can be applied. The recommendation's
own run (``[experiment] verify``, points marked ``verify``) is compared level
by level with the better of baseline and speculative (``verification``).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from .. import __version__
from .._document import checked, reading
from .._walk import read_file, write_file
from ..engines import (
    ApplyPlan,
    ApplyStatus,
    SpecCommand,
    engine,
    engine_files,
    plan_apply,
    plan_as_measured,
    plan_patched,
    read_command,
)
from ..errors import GpuslateError
from ..extras import Extra, install_hint
from ..outcome import Outcome, StatusEnum
from .rundir import VERIFY_SCHEMA, load_run, load_verification, write_json_atomic
from .threshold import MIN_REPEATS, Recommendation, ratio_interval, recommend

SCHEMA = "gpuslate.experiment.v1"
#: every engine file a report may write (every engine's: gpuslate.engines); those it does not write this
#: time are removed (with the names earlier versions wrote), so that a folder never holds a configuration
#: the report disowns
ENGINE_FILES = engine_files()
_FORMER_ENGINE_FILES = ("vllm-config.json", "sim-args.txt")
#: a file a deployment's command names (TensorRT-LLM's options file) is read at most this large
MAX_ENGINE_FILE_BYTES = 256 * 1024
STATS = ("ttft_ms", "tpot_ms", "itl_ms", "chunk_gap_ms", "e2e_ms")
QUANTILES = ("mean", "p50", "p90", "p99")
CSV_COLUMNS = ("deployment", "role", "concurrency", "repeats", "completed", "failed", "output_tokens",
               "output_tok_s_mean", "output_tok_s_min", "output_tok_s_max", "request_per_s", "total_tok_s",
               "ttft_ms_mean", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_mean", "itl_ms_mean", "itl_ms_p50",
               "itl_ms_p99", "chunk_gap_ms_mean", "chunk_gap_ms_p50", "e2e_ms_mean", "e2e_ms_p50", "e2e_ms_p99",
               "per_request_tok_s", "accept_length", "accept_length_spec", "spec_step_share", "tokens_estimated")


class ExperimentStatus(StatusEnum):
    REPORTED = "reported", Outcome.DONE  # experiment report: the report is written (whatever the points say)
    COMPLETE = "complete", Outcome.DONE  # experiment run: every point ran and no request failed
    PARTIAL = "partial", Outcome.PARTIAL  # some requests failed
    FAILED = "failed", Outcome.FAILED  # no request succeeded


@dataclass
class Report:
    """``experiment report`` (and, with ``run``, ``experiment run``): the ``gpuslate.experiment.v1``
    document. ``recommendation`` is the object where it was computed; read back from a document it
    is None and its JSON is ``summary["recommendation"]`` (what the renderer shows either way)."""

    summary: dict[str, Any]  # the gpuslate.experiment.v1 document (summary.json)
    recommendation: Recommendation | None
    files: list[str]
    run: dict[str, Any] | None = None  # experiment run: the points it ran, resumed, its transitions

    @property
    def status(self) -> ExperimentStatus:
        if self.run is None:
            return ExperimentStatus.REPORTED
        levels = self.summary["levels"]
        if levels and not any(r["completed"] for r in levels):
            return ExperimentStatus.FAILED
        return ExperimentStatus.PARTIAL if self.failed_requests else ExperimentStatus.COMPLETE

    @property
    def failed_requests(self) -> int:
        return sum(r["failed"] for r in self.summary["levels"])

    def to_json(self) -> dict[str, Any]:
        return self.summary if self.run is None else {**self.summary, "run": self.run}

    @classmethod
    def from_json(cls, doc: object) -> Report:
        d = checked(doc, SCHEMA)
        with reading(SCHEMA):
            summary = {k: v for k, v in d.items() if k != "run"}
            run = d.get("run")
            files = summary["files"]
            levels = summary["levels"]
            if not isinstance(levels, list) or not all(isinstance(r, dict) and isinstance(r["completed"], int)
                                                       and isinstance(r["failed"], int) for r in levels):
                raise TypeError("levels: expected rows with completed and failed counts")
            if run is not None and not isinstance(run, dict):
                raise TypeError(f"run: expected an object, got {run!r}")
            if summary.get("recommendation") is not None and not isinstance(summary["recommendation"], dict):
                raise TypeError("recommendation: expected an object")
            listed = [files["report"], files["summary_json"], files["summary_csv"], *files["plots"],
                      *files["engines"]]
            _check_shown(summary)
            return cls(summary, None, [str(f) for f in listed], run)


def _check_shown(s: dict[str, Any]) -> None:
    """What the report shows of a summary is there and of its type (a TypeError, KeyError or
    ValueError otherwise): the pure parts of its rendering are made once, and thrown away."""
    if not all(isinstance(s[k], str) for k in ("name", "dir")) or not isinstance(s["complete"], bool):
        raise TypeError("name, dir, complete: expected two strings and a boolean")
    if not all(isinstance(s["points"][k], int) for k in ("done", "total")):
        raise TypeError("points: expected done and total counts")
    level_tables(s["levels"])
    order_sentence(s)
    time_scale_sentence(s["time_scale"])
    for c in s.get("threshold_check") or []:
        for x in (c["ratio"], c["interval"][0], c["interval"][1]):
            format(x, ".3f")  # a number (the report shows it so)
        c["concurrency"], c["verdict"]  # there
    rec = s.get("recommendation")
    if rec is not None:
        if not isinstance(rec["summary"], str) or not isinstance(rec["warnings"], list):
            raise TypeError("recommendation: expected a summary and warnings")
        if rec.get("apply") is not None:
            apply_lines(rec["apply"])
    if s.get("verification") is not None:
        verification_lines(s["verification"])
        switch_lines(s["verification"])
    emulated_sentence(s)


DEMO_SCHEMA = "gpuslate.demo.v1"


class DemoStatus(StatusEnum):
    CLEAN = "clean", Outcome.DONE  # the demo ran, and every GPU is free with no unit running
    NOT_CLEAN = "not_clean", Outcome.NOT_DONE  # it ran, but the slate is not clean at the end


class DemoResult(NamedTuple):
    """``gpuslate demo``: its experiment's report and the clean-slate check at the end (``gpuslate.demo.v1``)."""

    sim: str
    out: str
    elapsed_s: float
    clean: dict[str, Any]  # ok, gpus, gpus_free, units_running, interrupted
    run: dict[str, Any]
    experiment: Report
    engine: str | None = None  # the engine the story was told in (emulated)

    @property
    def status(self) -> DemoStatus:
        return DemoStatus.CLEAN if self.clean["ok"] else DemoStatus.NOT_CLEAN

    def to_json(self) -> dict[str, Any]:
        return {"schema": DEMO_SCHEMA, "ok": self.clean["ok"], "sim": self.sim, "out": self.out,
                "elapsed_s": self.elapsed_s, "engine": self.engine, "emulated": True, "clean": self.clean,
                "run": self.run, "experiment": self.experiment.to_json()}

    @classmethod
    def from_json(cls, doc: object) -> DemoResult:
        d = checked(doc, DEMO_SCHEMA)
        with reading(DEMO_SCHEMA):
            clean, run, elapsed = d["clean"], d["run"], d["elapsed_s"]
            if not isinstance(clean, dict) or not all(isinstance(clean[k], int) for k in
                                                      ("ok", "gpus", "gpus_free", "units_running")):
                raise TypeError(f"clean: expected the clean-slate check, got {clean!r}")
            if not isinstance(run, dict) or isinstance(elapsed, bool) or not isinstance(elapsed, (int, float)):
                raise TypeError("run, elapsed_s: expected an object and seconds")
            engine_name = d.get("engine")
            if engine_name is not None and not isinstance(engine_name, str):
                raise TypeError(f"engine: expected a name, got {engine_name!r}")
            return cls(str(d["sim"]), str(d["out"]), elapsed, dict(clean), dict(run), Report.from_json(d["experiment"]),
                       engine_name)


def aggregate(points: list[dict[str, Any]], time_scale: float = 1.0) -> list[dict[str, Any]]:
    """One row per (deployment, level), in the order points were listed."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for p in sorted(points, key=lambda p: (p["concurrency"], p["repeat"])):
        if p.get("control") or p.get("verify"):
            continue  # the drift control is not a repeat of its deployment, nor is the verification
        groups.setdefault((p["deployment"], p["concurrency"]), []).append(p)
    rows = []
    for (dep, c), ps in groups.items():
        lv = [p["level"] for p in ps]
        thr = [_round(v["output_token_throughput"] / time_scale, 4) for v in lv]
        known = [t for t in thr if t is not None]  # None: not finite (min/max of a None would raise)
        row: dict[str, Any] = {
            "deployment": dep, "role": ps[0].get("role"), "concurrency": c, "repeats": len(ps),
            "completed": sum(v["completed"] for v in lv), "failed": sum(v["failed"] for v in lv),
            "output_tokens": sum(v["output_tokens"] for v in lv),
            "input_tokens": sum(v["input_tokens"] for v in lv),
            "output_token_throughput": {"mean": _round(_mean(thr), 4), "min": min(known, default=None),
                                        "max": max(known, default=None),
                                        "values": thr, "repeats": [p["repeat"] for p in ps]},
            "request_throughput": _round(_mean([v["request_throughput"] / time_scale for v in lv]), 4),
            "total_token_throughput": _round(_mean([v["total_token_throughput"] / time_scale for v in lv]), 4),
            "tokens_estimated": any(v.get("tokens_estimated") for v in lv),
        }
        for stat in STATS:
            row[stat] = {q: _round(_mean([_num((v.get(stat) or {}).get(q)) * time_scale for v in lv]), 4)
                         for q in QUANTILES}
        tpot = row["tpot_ms"]["mean"]
        row["per_request_tok_s"] = _round(1000.0 / tpot, 4) if tpot and tpot > 0 else None
        for key in ("accept_length", "accept_length_spec", "spec_step_share"):
            vals = [v[key] for v in lv if v.get(key) is not None]
            row[key] = _round(_mean(vals), 4) if vals else None
        row["warming"] = any(v.get("warming") for v in lv)
        rows.append(row)
    return rows


def measure_drift(points: list[dict[str, Any]], order: str) -> dict[str, Any]:
    """The run's drift (relative, >= 0) from the points; see the module docstring.

    Interleaved: per level, each deployment's repeats relative to its own mean, averaged over the
    deployments per repeat; the drift is the largest range of those per-repeat means over the
    levels. Blocked: the control point against the same deployment and level in repeat 0.
    """
    measured = [p for p in points if not p.get("control") and not p.get("verify")]
    if order == "blocked":
        controls = [p for p in points if p.get("control")]
        if not controls:
            return {"drift": None, "how": "blocked order: the control point has not run yet"}
        ctl = max(controls, key=lambda p: p["repeat"])  # the latest (a resume with more repeats adds one)
        ref = next((p for p in measured if p["deployment"] == ctl["deployment"]
                    and p["concurrency"] == ctl["concurrency"] and p["repeat"] == 0), None)
        if ref is None or not ref["level"]["output_token_throughput"]:
            return {"drift": None, "how": "blocked order: no first measurement of the control level"}
        change = ctl["level"]["output_token_throughput"] / ref["level"]["output_token_throughput"] - 1
        return {"drift": abs(change), "change": round(change, 4), "how": (
            f"blocked order: {ctl['deployment']} at concurrency {ctl['concurrency']} measured again at the end "
            f"changed by {change:+.1%}")}
    by: dict[int, dict[str, dict[int, float]]] = {}
    for p in measured:
        by.setdefault(p["concurrency"], {}).setdefault(p["deployment"], {})[p["repeat"]] = \
            p["level"]["output_token_throughput"]
    worst, per_level = 0.0, {}
    for c, deps in sorted(by.items()):
        repeats = sorted(set.intersection(*(set(v) for v in deps.values())))
        if len(repeats) < 2:
            continue
        rel: dict[int, list[float]] = {r: [] for r in repeats}
        for vals in deps.values():
            mean = sum(vals[r] for r in repeats) / len(repeats)
            if mean > 0:
                for r in repeats:
                    rel[r].append(vals[r] / mean)
        common = [sum(v) / len(v) for v in rel.values() if v]
        if len(common) >= 2:
            per_level[c] = max(common) - min(common)
            worst = max(worst, per_level[c])
    if not per_level:
        return {"drift": None, "how": "interleaved order: fewer than 2 repeats, drift not measured"}
    top = max(per_level, key=lambda c: per_level[c])
    return {"drift": round(worst, 4), "per_level": {str(c): round(v, 4) for c, v in per_level.items()},
            "how": f"interleaved order: every deployment moved together by up to {worst:.1%} between repeats "
                   f"(largest at concurrency {top})"}


def build_summary(out: str | Path) -> tuple[dict[str, Any], Recommendation | None, list[dict[str, Any]]]:
    out = Path(out)
    run, points = load_run(out)
    spec = run.get("spec", {})
    scale = float(spec.get("time_scale", 1.0))
    order = [d["name"] for d in spec.get("deployments", [])]
    rows = sorted(aggregate(points, scale),
                  key=lambda r: (order.index(r["deployment"]) if r["deployment"] in order else len(order),
                                 r["concurrency"]))
    drift = measure_drift(points, spec.get("order", "interleaved"))
    widen = level_drifts(drift, spec.get("order", "interleaved"))
    command = _speculative_command(spec, points)
    rec, rec_note = _recommendation(spec, rows, widen, drift.get("drift") is not None, command)
    total = len(order) * len(spec.get("levels", [])) * int(spec.get("repeats", 1)) \
        + (1 if spec.get("order") == "blocked" else 0)
    engines = {p["deployment"]: p.get("engine", {}) for p in points if not p.get("verify")}
    counts: dict[str, int] = {}
    measured = [p for p in points if not p.get("verify")]
    for p in measured:
        counts[p["deployment"]] = counts.get(p["deployment"], 0) + 1
    rec_doc = None
    if rec is not None:
        rec_doc = rec.to_json()
        assert command is not None  # a recommendation has a speculative deployment
        rec_doc["apply"] = _apply(spec, rec, out, command, _engine_version(command, spec, points)).to_json()
        rec_doc["next"] = _next_step(spec, rec, out, len(measured) >= total > 0)
    summary = {
        "schema": SCHEMA, "name": spec.get("name"), "dir": str(out), "spec": spec.get("path"),
        "gpuslate_version": __version__, "created_at": run.get("created_at"),
        "complete": len(measured) >= total > 0, "points": {"done": len(measured), "total": total},
        "time_scale": scale, "order": spec.get("order", "interleaved"), "drift": drift,
        "deployments": [{"name": d["name"], "role": d.get("role"), "command": d.get("command"),
                         "engine": engines.get(d["name"]), "points": counts.get(d["name"], 0)}
                        for d in spec.get("deployments", [])],
        "levels": rows,
        "recommendation": rec_doc, "recommendation_note": rec_note,
        "threshold_check": _threshold_check(rows, widen),
    }
    summary["verification"], summary["verification_note"] = _verification(summary, spec, points, out)
    if rec_doc is not None and summary["verification"] is not None:
        _withdraw_on_collapse(rec_doc, summary["verification"])
    apply = (rec_doc or {}).get("apply")
    if apply and apply["status"] == ApplyStatus.READY.value and summary["verification"] is None:
        apply["unproven"].insert(0, "its own run: set [experiment] verify = 1 in the spec and --resume, which "
                                 "runs it against the better of baseline and speculative")
    return summary, rec, rows


def write_report(out: str | Path) -> Report:
    """Write summary.json, summary.csv, the plots, report.md and (when it can be applied) the
    recommendation's engine files into ``out``; engine files it does not write are removed."""
    out = Path(out)
    summary, rec, rows = build_summary(out)
    plots, note = _plots(rows, out, summary, rec)
    apply = (summary.get("recommendation") or {}).get("apply") or {}
    engine_files: dict[str, str] = apply.get("files") or {}
    for name in (*ENGINE_FILES, *_FORMER_ENGINE_FILES):
        if name not in engine_files:
            (out / name).unlink(missing_ok=True)
    for name, text in engine_files.items():
        write_file(out / name, text.encode(), what="experiment directory")
    summary["files"] = {"report": "report.md", "summary_json": "summary.json", "summary_csv": "summary.csv",
                        "plots": plots, "engines": sorted(engine_files)}
    summary["plots_note"] = note
    write_file(out / "summary.csv", to_csv(rows).encode(), what="experiment directory")
    write_file(out / "report.md", to_markdown(summary, rec, plots, note).encode(), what="experiment directory")
    write_json_atomic(out / "summary.json", summary)
    return Report(summary, rec, ["report.md", "summary.json", "summary.csv", *plots, *sorted(engine_files)])


def _plots(rows: list[dict[str, Any]], out: Path, summary: dict[str, Any],
           rec: Recommendation | None) -> tuple[list[str], str | None]:
    if not rows:
        return [], "no points yet"
    try:  # matplotlib is imported only by plots.py, and only when pictures are drawn
        from . import plots  # lazy: optional
    except ImportError as exc:
        return [], f"plots skipped: {exc}; {install_hint(Extra.PLOTS)}"
    marks = None
    if rec is not None and rec.crossover is not None:  # withdrawn after its own run: not recommended either
        marks = {"threshold": rec.threshold, "crossover": rec.crossover,
                 "recommended": bool((summary.get("recommendation") or {}).get("recommended"))}
    return plots.make_plots(rows, out, title=summary.get("name") or "experiment",
                            time_scale=summary["time_scale"], marks=marks), None


def level_drifts(drift: dict[str, Any], order: str) -> float:
    """What the intervals are widened by: the drift measured over the run, whatever the order.
    Blocked: a deployment's repeats ran back to back and their spread cannot see the drift, so
    the control's drift is added. Interleaved: each deployment's repeats were measured at
    different times, so their spread holds some of it, but with two or three repeats it says
    little; the drift all deployments shared between repeats is added too, so that a difference
    is claimed only beyond drift + noise (a CPU hog started halfway must not read as a win)."""
    return float(drift.get("drift") or 0.0)


def _by_role(spec: dict[str, Any], role: str) -> dict[str, Any] | None:
    return next((d for d in spec.get("deployments", []) if d.get("role") == role), None)


def _speculative_command(spec: dict[str, Any], points: list[dict[str, Any]]) -> SpecCommand | None:
    """The speculative deployment's command as read, with what its running server reported
    (the facts of its last point: SGLang's server args, the engine and version) and the files it
    names as they were when it ran (recorded in its points), else as they are now."""
    dep = _by_role(spec, "speculative")
    if dep is None:
        return None
    last: dict[str, Any] = next((p for p in reversed(points)
                                 if p["deployment"] == dep["name"] and not p.get("verify")), {})
    files = last.get("engine_files")
    recorded: dict[str, Any] = files if isinstance(files, dict) else {}
    cwd = (dep.get("unit") or {}).get("cwd")

    def read(path: str) -> str:
        text = recorded.get(path)
        return text if isinstance(text, str) else read_engine_file(path, cwd)

    return read_command(dep.get("command") or [], last.get("engine") or {}, read)


def read_engine_file(path: str, cwd: str | None = None) -> str:
    """A file a deployment's command names (relative: to the unit's working folder, else this
    process's), bounded and walked as every path gpuslate is given; OSError or ValueError if not."""
    full = Path(cwd or ".") / path if not Path(path).is_absolute() else Path(path)
    try:
        data = read_file(full, limit=MAX_ENGINE_FILE_BYTES + 1, what="engine options file")
    except GpuslateError as exc:
        raise ValueError(str(exc)) from None
    if len(data) > MAX_ENGINE_FILE_BYTES:
        raise ValueError(f"over {MAX_ENGINE_FILE_BYTES} bytes")
    return data.decode("utf-8", "replace")


def recorded_files(command: list[str], cwd: str | None) -> dict[str, str]:
    """The files a deployment's command names, as they are now (read as its engine reads the
    command): kept with each point, so that the report reads what ran."""
    seen: dict[str, str] = {}

    def record(path: str) -> str:
        seen[path] = read_engine_file(path, cwd)
        return seen[path]

    read_command(command, {}, record)
    return seen


def _engine_version(cmd: SpecCommand, spec: dict[str, Any], points: list[dict[str, Any]]) -> str | None:
    dep = _by_role(spec, "speculative") or {}
    facts = next((p.get("engine") or {} for p in reversed(points)
                  if p["deployment"] == dep.get("name") and not p.get("verify")), {})
    version = facts.get("version")
    return version if facts.get("engine") == cmd.engine and isinstance(version, str) else None


def _recommendation(spec: dict[str, Any], rows: list[dict[str, Any]], drift: float, drift_measured: bool,
                    command: SpecCommand | None) -> tuple[Recommendation | None, str | None]:
    roles = {d.get("role"): d["name"] for d in spec.get("deployments", [])}
    if "baseline" not in roles or "speculative" not in roles:
        return None, None
    used = [r for r in rows if r["deployment"] in (roles["baseline"], roles["speculative"])]
    if any(r["tokens_estimated"] for r in used) and not spec.get("allow_estimated"):
        return None, ("no threshold computed: the token counts are estimated (the servers reported no usage); "
                      "set [load] tokenizer, or [experiment] allow_estimated = true")

    def figures(name: str) -> dict[int, list[float]]:
        return {r["concurrency"]: r["output_token_throughput"]["values"] for r in rows if r["deployment"] == name}

    k = command.k if command is not None and command.k else int(spec.get("num_speculative_tokens", 3))
    try:
        return recommend(figures(roles["baseline"]), figures(roles["speculative"]),
                         min_margin=float(spec.get("min_margin", 0.0)), num_speculative_tokens=k,
                         drift=drift, drift_measured=drift_measured), None
    except ValueError:  # no level measured for both yet
        return None, None


def _apply(spec: dict[str, Any], rec: Recommendation, out: Path, command: SpecCommand,
           version: str | None) -> ApplyPlan:
    """``recommendation.apply``: the recommendation in the speculative deployment's own terms (or,
    with its ``threshold_flag``, in its patched engine's own flag)."""
    flag = (_by_role(spec, "speculative") or {}).get("threshold_flag")
    if not rec.recommended:
        why = rec.missing_evidence or ("the crossover is within drift + noise",)
        return ApplyPlan(ApplyStatus.NOT_RECOMMENDED, command.engine, blockers=command.blockers,
                         missing=command.missing, notes=(*command.notes, "nothing is written: " + "; ".join(why)),
                         version=version)
    if rec.decision == "disable_above":
        assert rec.threshold is not None
        if isinstance(flag, str):
            return plan_patched(command.argv, flag, rec.threshold, version=version)
        return plan_apply(command, rec.threshold, top=rec.largest_level, out_dir=out, version=version)
    dep = _by_role(spec, "baseline" if rec.decision == "always_off" else "speculative") or {}
    return plan_as_measured(rec.decision, dep.get("command") or [], command.engine, version)


def _next_step(spec: dict[str, Any], rec: Recommendation, out: Path, complete: bool) -> str | None:
    """What to run when the recommendation lacks its evidence."""
    if not rec.missing_evidence:
        return None
    path = spec.get("path") or "SPEC.toml"
    repeats = int(spec.get("repeats", 1))
    more = f"set [load] repeats = {MIN_REPEATS} in {path}, then run " if repeats < MIN_REPEATS else (
        "run " if not complete else f"set [load] repeats = {repeats + 1} in {path}, then run ")
    return f"to decide: {more}gpuslate experiment run {path} --out {out} --resume"


def plan_verification(summary: dict[str, Any], spec: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The recommendation's own run, from a summary and the run's spec (``experiment.json``'s):
    its deployment (the speculative unit with the recommended command line), the files it needs,
    and the levels each deployment runs (the recommendation at every level; baseline and
    speculative where they won, both where they tied). (None, why) when there is nothing to run."""
    rec = summary.get("recommendation")
    if rec is None:
        return None, summary.get("recommendation_note") or "no recommendation (no level measured for both)"
    apply = rec.get("apply") or {}
    if not summary.get("complete"):
        return None, "the sweep is incomplete"
    if not rec["recommended"]:
        return None, "no threshold recommended: " + rec["summary"]
    if apply.get("status") == ApplyStatus.AS_MEASURED.value:
        return None, f"nothing to verify: the recommendation is {apply.get('measured')}"
    if apply.get("status") != ApplyStatus.READY.value:
        what = [b["setting"] for b in apply.get("blockers", [])] + list(apply.get("missing", []))
        return None, f"the recommendation cannot be applied ({apply.get('status')}: {'; '.join(what)})"
    base, specd = _by_role(spec, "baseline"), _by_role(spec, "speculative")
    assert base is not None and specd is not None
    names = {d["name"] for d in spec.get("deployments", [])}
    name = (specd["name"][:52] + "-recommended")
    while name in names:
        name = name[:-1] + "x" if name[-1] != "x" else name + "x"
    levels: dict[str, list[int]] = {base["name"]: [], specd["name"]: [], name: []}
    for v in rec["levels"]:
        levels[name].append(v["concurrency"])
        if v["winner"] in ("baseline", "tie"):
            levels[base["name"]].append(v["concurrency"])
        if v["winner"] in ("speculative", "tie"):
            levels[specd["name"]].append(v["concurrency"])
    # across the switch: T, T+1 (measured or not) and the level above, each with both deployments
    switch = switch_levels(rec["threshold"], [v["concurrency"] for v in rec["levels"]])
    for n in levels:
        levels[n] = sorted(set(levels[n]) | set(switch))
    unit = {**specd["unit"], "name": name, "command": apply["command"]}
    return {"schema": VERIFY_SCHEMA, "name": name, "threshold": rec["threshold"], "engine": apply.get("engine"),
            "patched_flag": apply.get("patched_flag"),
            "command": apply["command"], "command_line": apply.get("command_line"), "unit": unit,
            "files": apply.get("files") or {}, "levels": levels, "order": [base["name"], specd["name"], name],
            "switch_levels": switch,
            "recommendation": rec["summary"], "gpuslate_version": __version__}, ""


def switch_levels(threshold: int, measured: list[int]) -> list[int]:
    """Where the recommendation switches speculation: T, T+1 and the measured level above T+1 (a
    collapse at the switch shows there, vLLM issue #49548's shape)."""
    above = sorted(c for c in measured if c > threshold + 1)[:1]
    return [threshold, threshold + 1, *above]


def _withdraw_on_collapse(rec: dict[str, Any], ver: dict[str, Any]) -> None:
    """A recommendation whose own run fell below the worse of baseline and speculative beyond
    drift + noise at a level around its switch is withdrawn: not recommended, nothing written,
    the reason and the figures said (they are the verification's ``switch`` rows)."""
    collapsed = [row for row in ver.get("switch") or [] if row["collapsed"]]
    if not collapsed or not rec.get("recommended") or rec.get("threshold") != ver.get("threshold"):
        return
    figures = "; ".join(f"at concurrency {r['concurrency']} {r['throughput']} tok/s against {r['worse_of_both']} "
                        f"for the worse of the two (ratio {r['ratio']:.3f} in [{r['interval'][0]:.3f}, "
                        f"{r['interval'][1]:.3f}])" for r in collapsed)
    reason = (f"its own run collapsed at the switch: {figures}; below both deployments beyond drift + noise, so "
              "switching costs more than either side gains there")
    rec["recommended"] = False
    rec["withdrawn"] = {"reason": reason, "levels": [r["concurrency"] for r in collapsed]}
    rec["summary"] = f"withdrawn (threshold {rec['threshold']}): {reason}"
    apply = rec.get("apply")
    if isinstance(apply, dict):
        apply["status"] = ApplyStatus.WITHDRAWN.value
        apply["files"] = {}
        apply["notes"] = [*apply.get("notes", []), f"nothing is written: {reason}"]


def _verification(summary: dict[str, Any], spec: dict[str, Any], points: list[dict[str, Any]],
                  out: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The recommendation's own run against the better of baseline and speculative, per level:
    the ratio with its interval (the spread of the three, the phase before's included, plus the
    drift measured over the run), and whether it matches within drift + noise."""
    plan = load_verification(out)
    if plan is None:
        if not spec.get("verify"):
            return None, None
        _, why = plan_verification(summary, spec)
        return None, (f"the recommendation's own run has not run yet: gpuslate experiment run "
                      f"{spec.get('path')} --out {out} --resume" if not why else f"verification skipped: {why}")
    try:
        return _verification_check(summary, spec, points, out, plan), None
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
        return None, f"{out / 'verification.json'} is not one gpuslate wrote: remove it, then --resume"


def _verification_check(summary: dict[str, Any], spec: dict[str, Any], points: list[dict[str, Any]], out: Path,
                        plan: dict[str, Any]) -> dict[str, Any]:
    scale = float(spec.get("time_scale", 1.0))
    by: dict[tuple[str, int], dict[int, float]] = {}
    facts: dict[str, Any] = {}
    for p in points:
        if p.get("verify"):
            by.setdefault((p["deployment"], p["concurrency"]), {})[p["repeat"]] = \
                p["level"]["output_token_throughput"] / scale
            if p["deployment"] == plan["name"]:
                facts = p.get("engine") or facts
    sweep = {(r["deployment"], r["concurrency"]): r["output_token_throughput"]["values"]
             for r in summary["levels"] if r["output_token_throughput"]["values"]}
    spread = {k: _spread(v) for k, v in sweep.items()}
    drift = float((summary.get("drift") or {}).get("drift") or 0.0)
    base, specd = plan["order"][0], plan["order"][1]
    levels = []
    for c in plan["levels"][plan["name"]]:
        mine = by.get((plan["name"], c), {})
        others = [n for n in (base, specd) if c in plan["levels"].get(n, [])]
        repeats = sorted(set(mine).intersection(*(by.get((n, c), {}) for n in others)))
        if not repeats:
            continue
        best = [max(by[(n, c)][r] for n in others) for r in repeats]
        if min(best) <= 0:
            continue
        mv = [mine[r] for r in repeats]
        noise = max([spread.get((n, c), 0.0) for n in (base, specd)]
                    + [_spread(list(by[(n, c)].values())) for n in (*others, plan["name"])])
        # the machine may have changed since the sweep: a compared deployment's move between its
        # sweep and this run is measured drift too (the verification's own repeats may be one)
        moved = max((abs(_mean(list(by[(n, c)].values())) / _mean(sweep[(n, c)]) - 1)
                     for n in others if _mean(sweep.get((n, c)) or [0.0]) > 0), default=0.0)
        d = max(drift, moved)
        ratio, lo, hi = ratio_interval(mv, best, d, noise)
        verdict = "faster than the better" if lo > 1 else "slower than the better" if hi < 1 else "matches the better"
        levels.append({"concurrency": c, "throughput": _round(sum(mv) / len(mv)),
                       "best_of_both": _round(sum(best) / len(best)), "compared_with": others, "repeats": len(repeats),
                       "ratio": _round(ratio, 4), "interval": [_round(lo, 4), _round(hi, 4)], "drift": _round(d, 4),
                       "verdict": verdict})
    switch = []
    for c in plan.get("switch_levels") or []:
        mine, bv, sv = by.get((plan["name"], c), {}), by.get((base, c), {}), by.get((specd, c), {})
        repeats = sorted(set(mine) & set(bv) & set(sv))
        worse = [min(bv[r], sv[r]) for r in repeats]
        if not repeats or min(worse) <= 0:
            continue
        mv = [mine[r] for r in repeats]
        noise = max([spread.get((n, c), 0.0) for n in (base, specd)]
                    + [_spread(list(v.values())) for v in (mine, bv, sv)])
        moved = max((abs(_mean(list(by[(n, c)].values())) / _mean(sweep[(n, c)]) - 1)
                     for n in (base, specd) if _mean(sweep.get((n, c)) or [0.0]) > 0), default=0.0)
        d = max(drift, moved)
        ratio, lo, hi = ratio_interval(mv, worse, d, noise)
        switch.append({"concurrency": c, "throughput": _round(sum(mv) / len(mv)),
                       "baseline": _round(sum(bv[r] for r in repeats) / len(repeats)),
                       "speculative": _round(sum(sv[r] for r in repeats) / len(repeats)),
                       "worse_of_both": _round(sum(worse) / len(worse)), "repeats": len(repeats),
                       "ratio": _round(ratio, 4), "interval": [_round(lo, 4), _round(hi, 4)], "drift": _round(d, 4),
                       "collapsed": hi < 1})
    rec = summary.get("recommendation") or {}
    notes = []
    if rec.get("threshold") != plan["threshold"] or not rec.get("recommended"):
        notes.append(f"the run verified threshold {plan['threshold']}; the recommendation now is "
                     f"{rec.get('threshold') if rec.get('recommended') else 'none'}: to verify it, remove "
                     f"{out / 'verification.json'} and {out}/points/*__verify.json, then --resume")
    e = engine(plan.get("engine"))
    refused = e.not_taken(facts) if e is not None and not plan.get("patched_flag") else None
    if refused:
        notes.append(refused)
    slower = [v["concurrency"] for v in levels if v["verdict"] == "slower than the better"]
    return {"deployment": plan["name"], "threshold": plan["threshold"], "command": plan["command"],
            "engine": facts or None, "drift": _round(drift, 4), "levels": levels, "switch": switch,
            "collapsed_at": [row["concurrency"] for row in switch if row["collapsed"]],
            "matches": bool(levels) and not slower and len(levels) == len(plan["levels"][plan["name"]]),
            "slower_at": slower, "notes": notes}


def _threshold_check(rows: list[dict[str, Any]], drift: float) -> list[dict[str, Any]] | None:
    """Per level: the speculative+threshold deployment against the better of baseline and speculative,
    repeat by repeat, as a ratio with its interval (the spread pooled over the three, plus ``drift``)."""
    by: dict[str, dict[int, dict[int, float]]] = {}
    for r in rows:
        if r["role"]:
            t = r["output_token_throughput"]
            by.setdefault(r["role"], {})[r["concurrency"]] = dict(zip(t.get("repeats") or range(len(t["values"])),
                                                                      t["values"]))
    if not {"baseline", "speculative", "speculative+threshold"} <= set(by):
        return None
    out = []
    for c, tv in sorted(by["speculative+threshold"].items()):
        bv, sv = by["baseline"].get(c, {}), by["speculative"].get(c, {})
        repeats = sorted(set(tv) & set(bv) & set(sv))
        if not repeats:
            continue
        best = [max(bv[r], sv[r]) for r in repeats]
        mine = [tv[r] for r in repeats]
        if min(best) <= 0:
            continue
        d = drift
        # the noise of the level: the largest spread any of the three shows between its repeats
        noise = max(_spread([v[r] for r in repeats]) for v in (tv, bv, sv))
        ratio, lo, hi = ratio_interval(mine, best, d, noise)
        verdict = "beats both" if lo > 1 else "slower than the better" if hi < 1 else "no detectable difference"
        out.append({"concurrency": c, "throughput": _round(sum(mine) / len(mine)),
                    "best_of_both": _round(sum(best) / len(best)), "ratio": _round(ratio, 4),
                    "interval": [_round(lo, 4), _round(hi, 4)], "drift": _round(d, 4), "verdict": verdict})
    return out


# -- writers ------------------------------------------------------------------------


def to_csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for r in rows:
        t = r["output_token_throughput"]
        w.writerow([r["deployment"], r["role"] or "", r["concurrency"], r["repeats"], r["completed"], r["failed"],
                    r["output_tokens"], _round(t["mean"]), _round(t["min"]), _round(t["max"]),
                    _round(r["request_throughput"], 4), _round(r["total_token_throughput"]),
                    _round(r["ttft_ms"]["mean"], 3), _round(r["ttft_ms"]["p50"], 3), _round(r["ttft_ms"]["p99"], 3),
                    _round(r["tpot_ms"]["mean"], 3), _round(r["itl_ms"]["mean"], 3), _round(r["itl_ms"]["p50"], 3),
                    _round(r["itl_ms"]["p99"], 3), _round(r["chunk_gap_ms"]["mean"], 3),
                    _round(r["chunk_gap_ms"]["p50"], 3), _round(r["e2e_ms"]["mean"], 3), _round(r["e2e_ms"]["p50"], 3),
                    _round(r["e2e_ms"]["p99"], 3), _round(r["per_request_tok_s"]),
                    *("" if r.get(k) is None else _round(r[k], 3)
                      for k in ("accept_length", "accept_length_spec", "spec_step_share")),
                    "yes" if r["tokens_estimated"] else ""])
    return buf.getvalue()


def level_tables(rows: list[dict[str, Any]]) -> list[tuple[int, list[list[str]]]]:
    """Per concurrency level: a header row and one row per deployment (shared by report.md and the CLI)."""
    head = ["deployment", "output tok/s", "spread", "req/s", "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms",
            "ITL p99 ms", "TPOT ms", "e2e p50 ms", "accept", "spec steps", "ok/failed"]  # each figure's unit said
    levels: dict[int, list[list[str]]] = {}
    for r in rows:
        t = r["output_token_throughput"]
        spread = (t["max"] - t["min"]) / t["mean"] if t["mean"] else 0.0  # mean 0: nothing completed
        levels.setdefault(r["concurrency"], [head]).append([
            r["deployment"] + (f" ({r['role']})" if r["role"] and r["role"] != r["deployment"] else ""),
            f"{t['mean']:.1f}" + ("~" if r["tokens_estimated"] else "") + ("!" if r.get("warming") else ""),
            f"±{spread / 2:.1%}" if r["repeats"] > 1 else "-", f"{r['request_throughput']:.2f}",
            _ms(r["ttft_ms"]["p50"]), _ms(r["ttft_ms"]["p99"]), _ms(r["itl_ms"]["p50"]), _ms(r["itl_ms"]["p99"]),
            _ms(r["tpot_ms"]["mean"]), _ms(r["e2e_ms"]["p50"]),
            "-" if r.get("accept_length") is None else f"{r['accept_length']:.2f}",
            "-" if r.get("spec_step_share") is None else f"{r['spec_step_share']:.0%}",
            f"{r['completed']}/{r['failed']}"])
    return sorted(levels.items())


def to_markdown(summary: dict[str, Any], rec: Recommendation | None, plots: list[str], note: str | None) -> str:
    lines = [f"# Experiment {summary['name']}", ""]
    pts = summary["points"]
    lines.append(f"{pts['done']} of {pts['total']} points" + ("" if summary["complete"] else " (incomplete)")
                 + f"; gpuslate {summary['gpuslate_version']}; spec `{Path(summary['spec'] or 'spec.toml').name}` "
                 "(a copy: `spec.toml`).")
    lines.append(order_sentence(summary))
    if summary["time_scale"] != 1:
        lines.append(time_scale_sentence(summary["time_scale"]))
    lines += ["", "## Deployments", ""]
    emulated = emulated_sentence(summary)
    if emulated:
        lines += [f"**{emulated}**", ""]
    lines += ["| deployment | role | engine | command |", "| --- | --- | --- | --- |"]
    for d in summary["deployments"]:
        eng = d.get("engine") or {}
        engine = " ".join(str(x) for x in (eng.get("engine"), eng.get("version")) if x) or "-"
        engine += " (emulated)" if eng.get("simulated") else ""
        cmd = " ".join(_shown_command(d.get("command") or [])).replace("|", "\\|")
        lines.append(f"| {d['name']} | {d.get('role') or '-'} | {engine} | `{cmd}` |")
    doc = summary.get("recommendation")
    if rec is not None and doc is not None:
        lines += ["", "## Recommendation", "", f"**{doc['summary']}**", ""]
        if doc.get("next"):
            lines += [f"_{doc['next']}_", ""]
        if doc.get("apply"):
            engine = doc["apply"].get("engine") or "the speculative deployment's engine"
            lines += [f"### Applying it ({_engine_name(engine)})", ""]
            lines += [f"- {ln}" for ln in apply_lines(doc["apply"], summary.get("files", {}).get("engines"))]
            lines += [""]
        lines += [f"- warning: {w}" for w in doc["warnings"]]
        lines += ["", "Speculative / baseline output throughput per level: the ratio, and the interval it lies in "
                  "(the spread of the repeats, which in an interleaved run were measured at different times and so "
                  "carry the drift; a blocked run adds the control's drift).", "",
                  "| concurrency | verdict | ratio | interval |", "| ---: | --- | ---: | --- |"]
        lines += [f"| {v.concurrency} | {_verdict(v.winner)} | {v.margin + 1:.3f} | "
                  f"[{v.interval[0]:.3f}, {v.interval[1]:.3f}] |" for v in rec.levels]
    elif summary.get("recommendation_note"):
        lines += ["", "## Recommendation", "", f"_{summary['recommendation_note']}_"]
    if summary.get("threshold_check"):
        lines += ["", "Speculation with the disable threshold against the better of the two, per level "
                  "(ratio and interval as above, the spread pooled over the three):", "",
                  "| concurrency | tok/s | best of both | ratio | interval | verdict |",
                  "| ---: | ---: | ---: | ---: | --- | --- |"]
        lines += [f"| {c['concurrency']} | {c['throughput']} | {c['best_of_both']} | {c['ratio']:.3f} | "
                  f"[{c['interval'][0]:.3f}, {c['interval'][1]:.3f}] | {c['verdict']} |"
                  for c in summary["threshold_check"]]
    ver = summary.get("verification")
    if ver is not None:
        lines += ["", "## The recommendation's own run", "", verification_sentence(ver), "",
                  "| concurrency | recommended tok/s | better of the two | compared with | ratio | interval "
                  "| verdict |",
                  "| ---: | ---: | ---: | --- | ---: | --- | --- |"]
        lines += ["| " + " | ".join(row) + " |" for row in verification_lines(ver)]
        if ver.get("switch"):
            lines += ["", "### Across the switch", "", switch_sentence(ver), "",
                      "| concurrency | recommended tok/s | baseline | speculative | worse of the two | ratio "
                      "| interval | verdict |", "| ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
            lines += ["| " + " | ".join(row) + " |" for row in switch_lines(ver)]
        lines += [f"- note: {n}" for n in ver.get("notes", [])]
    elif summary.get("verification_note"):
        lines += ["", "## The recommendation's own run", "", f"_{summary['verification_note']}_"]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{Path(p).stem}]({p})" for p in plots]
    elif note:
        lines += ["", f"_{note}_"]
    lines += ["", "## Per concurrency level", "",
              "Latencies in ms (TTFT, ITL percentiles and TPOT: the mean over repeats of each repeat's figure; "
              "ITL per token as SGLang counts it, the chunk gaps are in summary.csv); spread: half the max-min "
              "range of output tok/s over repeats, relative; accept: tokens per request-step over all steps; "
              "spec steps: the share of request-steps that were speculative; ~ estimated token counts; "
              "! the server was still warming up."]
    for c, table in level_tables(summary["levels"]):
        lines += ["", f"### Concurrency {c}", "", "| " + " | ".join(table[0]) + " |",
                  "|" + "|".join(" --- " if i == 0 else " ---: " for i in range(len(table[0]))) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in table[1:]]
    return "\n".join(lines) + "\n"


def _engine_name(name: str) -> str:
    e = engine(name)
    return e.title if e is not None else name


def apply_lines(apply: dict[str, Any], written: list[str] | None = None) -> list[str]:
    """What ``recommendation.apply`` says, one sentence a line (report.md and the CLI say the same):
    what was measured, what the files do, the command line, on which versions, what blocks it,
    what is missing, what remains unproven."""
    status = apply["status"]
    lines = []
    if apply.get("measured"):
        lines.append(f"Measured: {apply['measured']}.")
    if status in (ApplyStatus.READY.value, ApplyStatus.AS_MEASURED.value):
        lines.append(f"What it does: {apply['does']}.")
        names = written if written is not None else sorted(apply.get("files") or {})
        if names:
            lines.append("Written next to this report: " + ", ".join(f"`{n}`" for n in names) + ".")
        lines.append(f"Command line: `{apply['command_line']}`")
    else:
        lines.append({"blocked": "Nothing is written: the engine would not apply it (below).",
                      "unreadable": "Nothing is written: the command cannot be read (below).",
                      "withdrawn": "Nothing is written: the recommendation's own run collapsed at the switch "
                                   "(below).",
                      }.get(status, "Nothing is written."))
    if apply.get("patched_flag"):
        lines.append(f"Relies on a patch: {apply['patched_flag']} is the patched engine's own flag, not an upstream "
                     "knob.")
    if apply.get("versions"):
        lines.append(f"Versions: {apply['versions']}.")
    lines += [f"Blocked by {b['setting']}: {b['why']} ({b['source']})." for b in apply.get("blockers", [])]
    lines += [f"Missing: {m}." for m in apply.get("missing", [])]
    lines += [f"Note: {n}." for n in apply.get("notes", [])]
    lines += [f"Unproven: {u}." for u in apply.get("unproven", [])]
    return lines


def verification_sentence(ver: dict[str, Any]) -> str:
    levels = ver["levels"]
    what = (f"`{ver['deployment']}`: the speculative deployment with the written configuration (threshold "
            f"{ver['threshold']}), measured again with the deployment that won each level (both where they tied); "
            "recommended / the better of the two, repeat by repeat, with the interval of the three's spread "
            "plus the drift (the run's, or the compared deployment's move since its sweep if larger).")
    if not levels:
        return what + " No level has been measured yet."
    faster = [v["concurrency"] for v in levels if v["verdict"] == "faster than the better"]
    if ver["matches"] and not faster:
        return what + " **It matches the better of baseline and speculative within drift + noise at every level.**"
    if ver["matches"]:
        return what + (" **It matches or beats the better of baseline and speculative within drift + noise at "
                       "every level** (faster at concurrency " + ", ".join(map(str, faster)) + ": in a closed loop "
                       "its batch drops below the threshold now and then, where it speculates).")
    if ver["slower_at"]:
        return what + (" **It is slower than the better of the two at concurrency "
                       + ", ".join(map(str, ver["slower_at"])) + ".**")
    return what + " Not every level has been measured yet."


def emulated_sentence(summary: dict[str, Any]) -> str | None:
    """Said plainly when the engines were gpuslate's simulator playing them (``sim serve --emulate``):
    the figures are its performance model's, not the engine's."""
    played = sorted({f"{_engine_name(str(e.get('engine')))} {e.get('version') or ''}".rstrip()
                     for d in summary["deployments"] if isinstance(e := d.get("engine"), dict) and e.get("simulated")})
    if not played:
        return None
    return (f"The engines were emulated: gpuslate's simulated server played {', '.join(played)} under the engines' "
            "own command lines (sim serve --emulate, docs/sim-server.md), reading their arguments by their rules; "
            "the figures are its performance model's, not measurements of the engine.")


def switch_sentence(ver: dict[str, Any]) -> str:
    rows = ver.get("switch") or []
    what = (f"The recommendation's own run where it switches speculation (threshold {ver['threshold']}: "
            f"{', '.join(str(r['concurrency']) for r in rows)}), against the worse of baseline and speculative "
            "measured in the same repeats: a ratio whose whole interval is below 1 is a collapse (vLLM issue "
            "#49548: crossing the threshold there cost 8-way throughput from 232 to 24-157 tok/s).")
    collapsed = [str(r["concurrency"]) for r in rows if r["collapsed"]]
    if collapsed:
        return what + f" **It collapsed at concurrency {', '.join(collapsed)}: the recommendation is withdrawn.**"
    return what + " It held at every level there."


def switch_lines(ver: dict[str, Any]) -> list[list[str]]:
    """The switch check's table rows (concurrency, recommended, baseline, speculative, worse of the two,
    ratio, interval, verdict)."""
    return [[str(r["concurrency"]), f"{r['throughput']}", f"{r['baseline']}", f"{r['speculative']}",
             f"{r['worse_of_both']}", f"{r['ratio']:.3f}", f"[{r['interval'][0]:.3f}, {r['interval'][1]:.3f}]",
             "collapse" if r["collapsed"] else "holds"] for r in ver.get("switch") or []]


def verification_lines(ver: dict[str, Any]) -> list[list[str]]:
    """The verification's table rows (concurrency, tok/s, better of both, compared with, ratio,
    interval, verdict)."""
    return [[str(v["concurrency"]), f"{v['throughput']}", f"{v['best_of_both']}", ", ".join(v["compared_with"]),
             f"{v['ratio']:.3f}", f"[{v['interval'][0]:.3f}, {v['interval'][1]:.3f}]", v["verdict"]]
            for v in ver["levels"]]


def _shown_command(argv: list[str]) -> list[str]:
    """The command as people read it: the program by its name (summary.json keeps the full path)."""
    return [Path(argv[0]).name, *argv[1:]] if argv else argv


def order_sentence(summary: dict[str, Any]) -> str:
    """How the points were ordered and the drift measured (report.md and the CLI say the same)."""
    drift = summary.get("drift") or {}
    order = summary.get("order", "interleaved")
    how = ("interleaved: each repeat swept every deployment, the order rotated each repeat" if order == "interleaved"
           else "blocked: each deployment's repeats back to back, a control level measured again at the end")
    d = drift.get("drift")
    return (f"Order: {how}. Drift: " + ("not measured" if d is None else f"{d:.1%}")
            + (f" ({drift['how']})" if drift.get("how") else "") + ".")


def time_scale_sentence(scale: float) -> str:
    return (f"Modelled time: the simulated servers ran {scale:g}x faster than modelled; throughputs are divided "
            f"and latencies multiplied by {scale:g} (the raw figures are in `points/`).")


def _verdict(winner: str) -> str:
    return {"speculative": "speculative wins", "baseline": "baseline wins"}.get(winner, "no detectable difference")


def _spread(xs: list[float]) -> float:
    mean = sum(xs) / len(xs)
    return (max(xs) - min(xs)) / mean if mean > 0 else 0.0


def _mean(xs: Sequence[float | None]) -> float:
    """Mean of the finite values; NaN (reported as null) when there are none."""
    finite = [x for x in xs if x is not None and math.isfinite(x)]
    return sum(finite) / len(finite) if finite else math.nan


def _num(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) else math.nan


def _round(v: float | None, nd: int = 2) -> float | None:
    return None if v is None or not math.isfinite(v) else round(v, nd)


def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.1f}" if v >= 10 else f"{v:.2f}"
