"""The report from points on disk (no server): aggregation over repeats, unscaling by time_scale,
nulls for absent latencies, CSV, report.md, and the plots skipped (not crashed) without matplotlib."""

from __future__ import annotations

import csv
import io
import json
import shlex
import sys

import pytest

from gpuslate.bench.report import CSV_COLUMNS, aggregate, write_report
from gpuslate.bench.rundir import POINT_SCHEMA, write_json_atomic
from test_extras import gpuslate as gpuslate_without
from test_extras import loaded


def stat(v):
    return {"mean": v, "p50": v, "p90": v, "p99": v}


def point(dep, role, c, r, thr, *, ttft=10.0, failed=0, engine=None):
    return {"schema": POINT_SCHEMA, "deployment": dep, "role": role, "concurrency": c, "repeat": r,
            "engine": engine or {"engine": "gpuslate-sim", "version": "0"},
            "level": {"completed": 8, "failed": failed, "output_tokens": 256, "input_tokens": 64,
                      "output_token_throughput": thr, "request_throughput": thr / 32,
                      "total_token_throughput": thr * 1.25, "ttft_ms": stat(ttft), "tpot_ms": stat(5.0),
                      "itl_ms": stat(5.0), "e2e_ms": stat(100.0), "accept_length": None,
                      "tokens_estimated": False}}


def make_dir(tmp_path, points, *, scale=1.0, spec_command=("serve", "--spec"), repeats=2):
    out = tmp_path / "exp"
    deps = [{"name": "base", "role": "baseline", "command": ["serve"]},
            {"name": "spec", "role": "speculative", "command": list(spec_command)}]
    write_json_atomic(out / "experiment.json", {"spec": {
        "name": "x", "path": "x.toml", "deployments": deps, "levels": [1, 2], "repeats": repeats,
        "time_scale": scale}})
    for p in points:
        write_json_atomic(out / "points" / f"{p['deployment']}-{p['concurrency']}-{p['repeat']}.json", p)
    (out / "points" / ".half.json.123.tmp").write_text("{")  # a temp file of an interrupted write: ignored
    return out


FIGS = {("base", 1): (100, 104), ("base", 2): (200, 204), ("spec", 1): (130, 128), ("spec", 2): (150, 152)}


def all_points(engine=None, figs=FIGS):
    return [point(d, "baseline" if d == "base" else "speculative", c, r, v, engine=engine)
            for (d, c), vs in figs.items() for r, v in enumerate(vs)]


VLLM_SPEC = {"method": "eagle3", "model": "org/draft", "num_speculative_tokens": 4}
VLLM = ("vllm", "serve", "org/m", "--speculative-config", json.dumps(VLLM_SPEC), "--port", "8000")
SGLANG = ("python3", "-m", "sglang.launch_server", "--model-path", "org/m", "--speculative-algorithm", "EAGLE3",
          "--speculative-num-steps", "3", "--port", "30000")
SIM = ("python3", "-m", "gpuslate", "sim", "serve", "--port", "1", "--mode", "speculative")


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
    from gpuslate.cli.commands.experiment import outcome

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


def test_engine_files_from_a_vllm_command_order_drift_and_intervals(tmp_path):
    out = make_dir(tmp_path, all_points({"engine": "vllm", "version": "0.25.1"}), spec_command=VLLM)
    rep = write_report(out)
    assert rep.recommendation is not None and rep.recommendation.recommended and rep.recommendation.threshold == 1
    # vLLM's own form, complete (method, model, K kept), and the command line it goes into
    cfg = json.loads((out / "vllm-speculative-config.json").read_text())
    assert cfg == {**VLLM_SPEC, "num_speculative_tokens_per_batch_size": [[1, 1, 4], [2, 2, 0]]}
    line = shlex.split((out / "recommended-command.txt").read_text())
    assert line[:4] == list(VLLM[:4]) and json.loads(line[4]) == cfg and line[5:] == list(VLLM[5:])
    assert rep.summary["files"]["engines"] == ["recommended-command.txt", "vllm-speculative-config.json"]
    assert not (out / "sglang-adaptive-config.json").exists() and not (out / "sim-args.txt").exists()
    apply = rep.summary["recommendation"]["apply"]
    assert apply["status"] == "ready" and apply["version"] == "0.25.1" and apply["version_status"] == "has_knob"
    assert rep.summary["recommendation"]["engines"]["vllm_speculative_config"]["num_speculative_tokens"] == 4
    md = (out / "report.md").read_text()
    for said in ("### Applying it (vLLM)", "Measured: vLLM with a fixed K = 4", "What it does:", "Command line:",
                 "Versions: vLLM >= 0.25", "Unproven: its own run", "prefills included"):
        assert said in md, said
    assert "Order: interleaved" in md and "Drift: " in md and "| concurrency | verdict | ratio | interval |" in md
    drift = rep.summary["drift"]
    # FIGS: both deployments move together between repeats by ~2.7% at level 1 (base +4%, spec -1.5%...)
    assert drift["drift"] is not None and set(drift["per_level"]) == {"1", "2"}


def test_engine_files_from_an_sglang_command(tmp_path):
    out = make_dir(tmp_path, all_points({"engine": "sglang", "version": "0.5.11", "speculative_num_steps": 3}),
                   spec_command=SGLANG)
    rep = write_report(out)
    cfg = json.loads((out / "sglang-adaptive-config.json").read_text())
    assert cfg["1"] == {"candidate_steps": [3]} and cfg["2"] == {"candidate_steps": [0]}
    args = ["--speculative-adaptive", "--speculative-adaptive-config",
            str(out.absolute() / "sglang-adaptive-config.json")]
    assert shlex.split((out / "sglang-args.txt").read_text()) == args
    assert shlex.split((out / "recommended-command.txt").read_text()) == [*SGLANG, *args]
    md = (out / "report.md").read_text()
    assert "### Applying it (SGLang)" in md and "fixed --speculative-num-steps 3" in md and "extend" in md
    assert rep.summary["recommendation"]["engines"]["sglang_adaptive_config"]["1"] == {"candidate_steps": [3]}


def test_the_simulators_flag_is_no_engine_file(tmp_path):
    out = make_dir(tmp_path, all_points(), spec_command=SIM)
    rep = write_report(out)
    assert rep.summary["files"]["engines"] == ["recommended-command.txt"]
    assert shlex.split((out / "recommended-command.txt").read_text()) == [*SIM, "--spec-disable-threshold", "1"]
    md = (out / "report.md").read_text()
    assert "### Applying it (gpuslate's simulator)" in md and "no engine takes" in md


@pytest.mark.parametrize("command, engine, status, said", [
    (("serve", "--spec"), {"engine": "gpuslate-sim"}, "unreadable", "Missing: the command is none gpuslate reads"),
    ((*VLLM, "--data-parallel-size", "2"), {"engine": "vllm", "version": "0.25.0"}, "blocked",
     "Blocked by --data-parallel-size 2"),
    (VLLM, {"engine": "vllm", "version": "0.24.0"}, "blocked", "has no upstream switch"),
    ((*SGLANG, "--enable-dp-attention"), {"engine": "sglang"}, "blocked", "Blocked by --enable-dp-attention"),
])
def test_nothing_written_that_would_do_nothing(tmp_path, command, engine, status, said):
    out = make_dir(tmp_path, all_points(engine), spec_command=command)
    stale = ("vllm-speculative-config.json", "vllm-config.json", "sim-args.txt", "recommended-command.txt")
    for name in stale:
        (out / name).write_text("{}")  # an earlier report's (or an earlier gpuslate's) files
    rep = write_report(out)
    assert rep.recommendation is not None and rep.recommendation.recommended
    assert rep.summary["recommendation"]["apply"]["status"] == status
    assert rep.summary["files"]["engines"] == [] and not [f for f in stale if (out / f).exists()]
    md = (out / "report.md").read_text()
    assert said in md and "Nothing is written" in md


def test_an_interrupted_run_of_one_repeat_recommends_nothing_and_says_what_to_run(tmp_path):
    """Issue 26: Ctrl-C at 13 of 72 points (one repeat, no drift) gave recommended: true, zero-width
    intervals and engine files "ready to use"."""
    pts = [p for p in all_points({"engine": "vllm", "version": "0.25.0"}, FIGS) if p["repeat"] == 0]
    out = make_dir(tmp_path, pts, spec_command=VLLM, repeats=1)
    rep = write_report(out)
    rec = rep.summary["recommendation"]
    assert rec["recommended"] is False and rec["decision"] == "disable_above" and rec["threshold"] == 1
    assert rec["missing_evidence"] == ["fewer than 2 repeats of both deployments at concurrency 1, 2",
                                       "the drift was not measured"]
    assert rec["apply"]["status"] == "not_recommended" and rep.summary["files"]["engines"] == []
    assert not (out / "vllm-speculative-config.json").exists()
    assert rec["next"] == f"to decide: set [load] repeats = 2 in x.toml, then run gpuslate experiment run x.toml " \
                          f"--out {out} --resume"
    md = (out / "report.md").read_text()
    assert "too little evidence" in md and "--resume" in md and "Ready to use" not in md


def test_no_threshold_from_estimated_tokens_unless_allowed(tmp_path):
    pts = all_points()
    for p in pts:
        p["level"]["tokens_estimated"] = True
    out = make_dir(tmp_path, pts)
    rep = write_report(out)
    assert rep.recommendation is None and "estimated" in rep.summary["recommendation_note"]
    assert not (out / "vllm-speculative-config.json").exists()
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
    assert not (out / "recommended-command.txt").exists() and rep.summary["files"]["engines"] == []


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


def verified_dir(tmp_path, rec_figs, *, verify_threshold=1):
    """FIGS swept, then the recommendation's own run (a verification.json and __verify points): the
    recommendation at both levels, and across its switch (T, T+1: levels 1 and 2) both deployments too."""
    from gpuslate.bench.report import build_summary, plan_verification
    from gpuslate.bench.rundir import VERIFY_FILE

    out = make_dir(tmp_path, all_points({"engine": "vllm", "version": "0.25.0"}), spec_command=VLLM)
    manifest = json.loads((out / "experiment.json").read_text())
    for d in manifest["spec"]["deployments"]:
        d["unit"] = {"name": d["name"], "command": d["command"], "port": 8000}
    manifest["spec"]["verify"] = 1
    write_json_atomic(out / "experiment.json", manifest)
    plan, why = plan_verification(build_summary(out)[0], manifest["spec"])
    assert plan is not None and not why
    assert plan["name"] == "spec-recommended" and plan["levels"] == {"base": [1, 2], "spec": [1, 2],
                                                                    "spec-recommended": [1, 2]}
    assert plan["switch_levels"] == [1, 2]  # T, T+1 (and no level measured above)
    plan["threshold"] = verify_threshold
    write_json_atomic(out / VERIFY_FILE, plan)
    figs = {("base", 2): 202, ("spec", 1): 129, ("base", 1): 102, ("spec", 2): 151,
            **{("spec-recommended", c): v for c, v in rec_figs.items()}}
    for (dep, c), v in figs.items():
        p = point(dep, "recommended" if dep == "spec-recommended" else None, c, 0, v)
        p["verify"] = True
        write_json_atomic(out / "points" / f"{dep}-{c}-0-verify.json", p)
    return out


def test_the_recommendations_own_run_against_the_better_of_the_two(tmp_path):
    out = verified_dir(tmp_path, {1: 128.0, 2: 150.0})  # speculating at 2 too: the threshold did nothing there
    rep = write_report(out)
    ver = rep.summary["verification"]
    assert [(v["concurrency"], v["compared_with"], v["verdict"]) for v in ver["levels"]] == [
        (1, ["base", "spec"], "matches the better"), (2, ["base", "spec"], "slower than the better")]
    assert not ver["matches"] and ver["slower_at"] == [2] and not ver["notes"]
    assert all(r["repeats"] == 2 for r in rep.summary["levels"])  # the run's points are not repeats of the sweep
    md = (out / "report.md").read_text()
    assert "slower than the better of the two at concurrency 2" in md and "Unproven: its own run" not in md


def test_a_verification_of_another_threshold_or_not_ours_is_said(tmp_path):
    out = verified_dir(tmp_path, {1: 129.0, 2: 203.0}, verify_threshold=4)
    ver = write_report(out).summary["verification"]
    assert ver["matches"] and "verified threshold 4; the recommendation now is 1" in ver["notes"][0]
    (out / "verification.json").write_text(json.dumps({"schema": "gpuslate.experiment.verification.v1",
                                                       "name": "x", "levels": 3}))
    s = write_report(out).summary
    assert s["verification"] is None and "is not one gpuslate wrote" in s["verification_note"]


def test_the_run_refuses_a_verification_file_that_writes_outside_its_folder(tmp_path):
    from gpuslate.bench.experiment import _checked_plan
    from gpuslate.errors import UsageError

    plan = {"name": "s-recommended", "files": {"../../evil": "x"}, "levels": {"s-recommended": [1]},
            "order": ["s-recommended"], "unit": {"command": ["serve"], "port": 1}}
    with pytest.raises(UsageError, match="is not one gpuslate wrote"):
        _checked_plan(plan, tmp_path, {"b", "s"})
    plan["files"] = {"recommended-command.txt": "serve\n"}
    assert _checked_plan(plan, tmp_path, {"b", "s"}).command == ["serve"]
    with pytest.raises(UsageError):
        _checked_plan({**plan, "name": "b"}, tmp_path, {"b", "s"})  # another deployment's name
