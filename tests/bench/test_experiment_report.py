"""The report from points on disk (no server): aggregation over repeats, unscaling by time_scale,
nulls for absent latencies, CSV, report.md, and the plots skipped (not crashed) without matplotlib."""

from __future__ import annotations

import csv
import io
import json
import sys

import pytest

from gpuslate.bench.experiment import POINT_SCHEMA, write_json_atomic
from gpuslate.bench.report import CSV_COLUMNS, aggregate, write_report
from test_extras import gpuslate as gpuslate_without
from test_extras import loaded


def stat(v):
    return {"mean": v, "p50": v, "p90": v, "p99": v}


def point(dep, role, c, r, thr, *, ttft=10.0, failed=0):
    return {"schema": POINT_SCHEMA, "deployment": dep, "role": role, "concurrency": c, "repeat": r,
            "engine": {"engine": "gpuslate-sim", "version": "0"},
            "level": {"completed": 8, "failed": failed, "output_tokens": 256, "input_tokens": 64,
                      "output_token_throughput": thr, "request_throughput": thr / 32,
                      "total_token_throughput": thr * 1.25, "ttft_ms": stat(ttft), "tpot_ms": stat(5.0),
                      "itl_ms": stat(5.0), "e2e_ms": stat(100.0), "accept_length": None,
                      "tokens_estimated": False}}


def make_dir(tmp_path, points, *, scale=1.0):
    out = tmp_path / "exp"
    deps = [{"name": "base", "role": "baseline", "command": ["serve"]},
            {"name": "spec", "role": "speculative", "command": ["serve", "--spec"]}]
    write_json_atomic(out / "experiment.json", {"spec": {
        "name": "x", "path": "x.toml", "deployments": deps, "levels": [1, 2], "repeats": 2, "time_scale": scale}})
    for p in points:
        write_json_atomic(out / "points" / f"{p['deployment']}-{p['concurrency']}-{p['repeat']}.json", p)
    (out / "points" / ".half.json.123.tmp").write_text("{")  # a temp file of an interrupted write: ignored
    return out


FIGS = {("base", 1): (100, 104), ("base", 2): (200, 204), ("spec", 1): (130, 128), ("spec", 2): (150, 152)}


def all_points():
    return [point(d, "baseline" if d == "base" else "speculative", c, r, v)
            for (d, c), vs in FIGS.items() for r, v in enumerate(vs)]


def test_aggregate_and_unscale():
    rows = aggregate(all_points(), time_scale=2.0)
    base1 = next(r for r in rows if r["deployment"] == "base" and r["concurrency"] == 1)
    assert base1["repeats"] == 2 and base1["completed"] == 16
    assert base1["output_token_throughput"] == {"mean": 51.0, "min": 50.0, "max": 52.0, "values": [50.0, 52.0],
                                                "repeats": [0, 1]}
    assert base1["ttft_ms"]["p50"] == 20.0 and base1["per_request_tok_s"] == 100.0  # 1000 / (5 ms * 2)


def test_absent_latencies_are_null():
    p = point("base", "baseline", 1, 0, 10.0)
    p["level"]["ttft_ms"] = stat(None)
    row = aggregate([p])[0]
    assert row["ttft_ms"] == {"mean": None, "p50": None, "p90": None, "p99": None}


def test_report_files(tmp_path):
    out = make_dir(tmp_path, all_points())
    rep = write_report(out)
    s = json.loads((out / "summary.json").read_text())
    assert s == json.loads(json.dumps(rep.summary))
    assert s["complete"] and s["points"] == {"done": 8, "total": 8}
    assert s["recommendation"]["threshold"] == 1 and s["recommendation"]["crossover"] == [1, 2]
    rows = list(csv.reader(io.StringIO((out / "summary.csv").read_text())))
    assert tuple(rows[0]) == CSV_COLUMNS and len(rows) == 5
    md = (out / "report.md").read_text()
    assert "### Concurrency 1" in md and "### Concurrency 2" in md and "disable it above 1" in md
    assert all((out / p).is_file() for p in s["files"]["plots"]) and len(s["files"]["plots"]) == 4


def test_partial_dir_and_no_pair(tmp_path):
    out = make_dir(tmp_path, [p for p in all_points() if p["deployment"] == "base"])
    s = write_report(out).summary
    assert not s["complete"] and s["points"] == {"done": 4, "total": 8} and s["recommendation"] is None


def test_plots_skipped_without_matplotlib(tmp_path, monkeypatch):
    import gpuslate.bench

    monkeypatch.delitem(sys.modules, "gpuslate.bench.plots", raising=False)
    monkeypatch.delattr(gpuslate.bench, "plots", raising=False)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    out = make_dir(tmp_path, all_points())
    s = write_report(out).summary
    assert s["files"]["plots"] == [] and "plots skipped" in s["plots_note"]
    assert "plots skipped" in (out / "report.md").read_text()


@pytest.mark.parametrize("failed, completed, code", [(0, 8, 0), (3, 8, 7), (8, 0, 6)])
def test_run_exit_code_from_failed_requests(tmp_path, failed, completed, code):
    from gpuslate.cli.experiment import outcome

    pts = all_points()
    for p in pts if completed == 0 else pts[:1]:
        p["level"].update(failed=failed, completed=completed)
    rep = write_report(make_dir(tmp_path, pts))
    assert outcome(rep) == 0  # experiment report: written, whatever the points say
    rep.run = {"points_run": len(pts), "points_skipped": 0, "elapsed_s": 1.0, "transitions": []}
    assert outcome(rep) == code  # experiment run: by its requests


def test_report_cli(tmp_path, cli):
    r = cli("experiment", "report", str(make_dir(tmp_path, all_points())))
    assert r.returncode == 0, r.stderr
    assert "Recommendation: speculation wins up to concurrency 1" in r.stdout and "concurrency 2" in r.stdout


@pytest.mark.parametrize("hide", [("aiohttp",), ("aiohttp", "matplotlib")])
def test_report_cli_needs_no_extra(tmp_path, hide):
    """The report reads points from disk: no load generator, so no aiohttp (the bench extra);
    without matplotlib too it is written, its plots skipped with the install line."""
    out = make_dir(tmp_path, all_points())
    r = gpuslate_without(["experiment", "report", str(out)], hide=hide)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "aiohttp" not in loaded(r)
    assert "Recommendation: speculation wins up to concurrency 1" in r.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["recommendation"]["threshold"] == 1
    assert (summary["files"]["plots"] == []) == ("matplotlib" in hide)


def test_engine_files_order_drift_and_intervals_in_the_report(tmp_path):
    out = make_dir(tmp_path, all_points())
    rep = write_report(out)
    assert rep.recommendation is not None and rep.recommendation.recommended and rep.recommendation.threshold == 1
    # SGLang's and vLLM's real forms, as files next to report.md
    assert json.loads((out / "vllm-config.json").read_text())["num_speculative_tokens_per_batch_size"] == [
        [1, 1, 3], [2, 2, 0]]
    assert json.loads((out / "sglang-adaptive-config.json").read_text())["2"] == {"candidate_steps": [0]}
    assert "sglang-adaptive-config.json" in (out / "sglang-args.txt").read_text()
    assert (out / "sim-args.txt").read_text().strip() == "--spec-disable-threshold 1"
    md = (out / "report.md").read_text()
    assert md.index("SGLang:") < md.index("vLLM:") < md.index("simulator:")  # the engines' forms lead
    assert "Order: interleaved" in md and "Drift: " in md and "| concurrency | verdict | ratio | interval |" in md
    drift = rep.summary["drift"]
    # FIGS: both deployments move together between repeats by ~2.7% at level 1 (base +4%, spec -1.5%...)
    assert drift["drift"] is not None and set(drift["per_level"]) == {"1", "2"}


def test_no_threshold_from_estimated_tokens_unless_allowed(tmp_path):
    pts = all_points()
    for p in pts:
        p["level"]["tokens_estimated"] = True
    out = make_dir(tmp_path, pts)
    rep = write_report(out)
    assert rep.recommendation is None and "estimated" in rep.summary["recommendation_note"]
    assert not (out / "vllm-config.json").exists()
    manifest = json.loads((out / "experiment.json").read_text())
    manifest["spec"]["allow_estimated"] = True
    write_json_atomic(out / "experiment.json", manifest)
    assert write_report(out).recommendation is not None


def test_a_crossover_inside_drift_and_noise_is_not_recommended(tmp_path):
    figs = {("base", 1): (100, 104), ("base", 2): (200, 204), ("spec", 1): (130, 128), ("spec", 2): (198, 206)}
    pts = [point(d, "baseline" if d == "base" else "speculative", c, r, v)
           for (d, c), vs in figs.items() for r, v in enumerate(vs)]
    out = make_dir(tmp_path, pts)
    rep = write_report(out)
    assert rep.recommendation is not None and not rep.recommendation.recommended
    assert "no threshold recommended" in rep.summary["recommendation"]["summary"]
    assert not (out / "vllm-config.json").exists() and rep.summary["files"]["engines"] == []


def test_drift_measured_by_the_blocked_order_control():
    from gpuslate.bench.report import measure_drift

    pts = all_points()
    assert measure_drift(pts, "blocked")["drift"] is None  # the control has not run yet
    ctl = point("base", "baseline", 1, 2, 90.0)  # repeat 0 of base at level 1 ran at 100: 10% slower now
    ctl["control"] = True
    d = measure_drift([*pts, ctl], "blocked")
    assert d["drift"] == pytest.approx(0.1) and d["change"] == pytest.approx(-0.1)
    assert "measured again at the end changed by -10.0%" in d["how"]
    assert all(r["repeats"] == 2 for r in aggregate([*pts, ctl]))  # the control is not a repeat


def test_drift_measured_by_the_interleaved_order():
    from gpuslate.bench.report import measure_drift

    # both deployments 10% slower in repeat 1 at level 2: a common move of ~10%
    pts = [point(d, None, 2, r, v) for d, vs in (("a", (100, 90)), ("b", (200, 180))) for r, v in enumerate(vs)]
    d = measure_drift(pts, "interleaved")
    assert d["drift"] == pytest.approx(0.1053, abs=1e-3) and d["per_level"] == {"2": pytest.approx(0.1053, abs=1e-3)}
    assert measure_drift(pts[::2], "interleaved")["drift"] is None  # one repeat: not measured
