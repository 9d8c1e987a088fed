"""An experiment that switches by parking (``[experiment] switch = "park"``): the demo's A/B (its own
spec, its engine's command lines with their park flags, each deployment on its own port) runs with both
deployments resident, every switch after the first cold start a proven park and resume; the points
say how their deployment came to serve, the report lists every switch's method and time beside what
a restart costs; nothing runs at the end, parked deployments included."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from expkit import free_port, kill_leftovers
from gpuslate.cli.commands.demo import scenario
from helpers import run_cli

pytestmark = pytest.mark.slow

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "docs/schemas/experiment.v1.json").read_text())


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_the_demos_ab_switches_by_park(sim_host, tmp_path, monkeypatch, engine):
    monkeypatch.setenv("GPUSLATE_LOCK_DIR", str(tmp_path / "locks"))
    spec = scenario(True, free_port(), engine, tmp_path, "park", free_port())
    # the demo's spec as it is, a smaller load: two levels, three repeats (AB BA AB), no verification
    spec = re.sub(r"\[load\]\n(.*\n)*?\n", "[load]\nconcurrency = [1, 4]\nrequests = 6\nrepeats = 3\nwarmup = 0\n"
                  "input_len = 16\noutput_len = 8\n\n", spec).replace("verify = 1 ", "verify = 0 ")
    (tmp_path / "demo.toml").write_text(spec)
    try:
        # run as a script runs it: no terminal to ask on, so the spec's clear = true needs --yes (the
        # demo itself runs its experiment as a library caller, its own consent: tests/bench/test_demo.py)
        r = run_cli("experiment", "run", str(tmp_path / "demo.toml"), "--out", str(tmp_path / "out"), "--json",
                    "--yes", timeout=300)
        assert r.returncode == 0, r.stderr
        summary = json.loads(r.stdout)
        jsonschema.Draft202012Validator(SCHEMA).validate(summary)
        sw = summary["switches"]
        # baseline up; speculative started cold (baseline parked); then every switch parks and resumes
        assert [i["method"] for i in sw["list"]] == ["park+restart", "park", "park"], sw
        assert sw["list"][1]["from"] == "speculative" and sw["list"][1]["to"] == "baseline"
        assert sw["by_method"]["park"]["median_s"] < sw["restart_s"] and sw["park_speedup"] > 1
        points = [json.loads(p.read_text()) for p in sorted((tmp_path / "out" / "points").glob("*.json"))]
        assert {p["switch"]["method"] for p in points} == {"start", "park+restart", "park"}
        assert all(p["switch"]["seconds"] > 0 for p in points)
        report = (tmp_path / "out" / "report.md").read_text()
        assert "## Switches between deployments" in report and "switching by park is" in report
        transitions = [json.loads(p.read_text()) for p in sorted((tmp_path / "out" / "transitions").glob("*.json"))]
        downs = [t["deployment"] for t in transitions if t["action"] == "down"]
        assert sorted(downs) == ["baseline", "speculative"]  # the one serving and the one parked, both stopped
        assert all(t["ok"] for t in transitions)
        assert "No processes" in run_cli("status").stdout
    finally:
        kill_leftovers(sim_host, [tmp_path / "state"])


def test_park_needs_a_port_per_deployment(tmp_path):
    spec = scenario(True, 30000, "sglang", tmp_path, "park", 30000)
    (tmp_path / "demo.toml").write_text(spec)
    r = run_cli("experiment", "run", str(tmp_path / "demo.toml"), "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and "each deployment needs its own (baseline 30000, speculative 30000)" in r.stderr
