"""gpuslate demo --quick end to end on a simulated 8-GPU host: the hand-started baseline cleared,
baseline and speculative swept, the recommendation and its own run, plots, and nothing left
running; also after a real SIGINT or SIGTERM midway."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import jsonschema
import pytest

from expkit import applied, kill_leftovers, popen_cli, says_its_verdict
from gpuslate.bench.report import DemoResult
from helpers import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timing]  # the whole file: the whole demo, end to end, measured


@pytest.fixture
def demo_env(sim_host, tmp_path, monkeypatch):
    """The demo makes its state folder with mkdtemp: TMPDIR puts it where the teardown finds it."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setenv("GPUSLATE_LOCK_DIR", str(tmp_path / "locks"))
    yield sim_host
    kill_leftovers(sim_host, list(tmp.glob("gpuslate-demo-*/state")))


VERDICTS = ("matches the better", "faster than the better", "slower than the better")


def test_demo_quick_end_to_end(demo_env, cli, tmp_path):
    out = tmp_path / "demo"
    t0 = time.monotonic()
    r = cli("--sim", str(demo_env.root), "demo", "--quick", "--out", str(out), "--json", timeout=110)
    elapsed = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "gpuslate.demo.v1" and doc["ok"]
    assert doc["clean"] == {"ok": True, "gpus": 8, "gpus_free": 8, "units_running": 0, "interrupted": False}
    assert DemoResult.from_json(doc).to_json() == doc  # what --host shows, read back
    assert elapsed < 60, elapsed
    exp = doc["experiment"]
    jsonschema.validate(exp, json.loads((Path(__file__).resolve().parents[2] / "docs/schemas/experiment.v1.json")
                                        .read_text()))
    assert exp["complete"] and [d["role"] for d in exp["deployments"]] == ["baseline", "speculative"]
    rec = exp["recommendation"]
    assert rec["recommended"] and rec["threshold"] == 1 and rec["crossover"] == [1, 2], rec
    assert rec["apply"]["status"] == "ready" and exp["files"]["engines"] == ["recommended-command.txt"]
    # the recommendation's own run: the speculative deployment with the threshold written, against the
    # better of the two at every level (the one that won it), matching it within drift + noise
    ver = exp["verification"]
    assert ver["threshold"] == 1 and ver["command"][-2:] == ["--spec-disable-threshold", "1"]
    assert [v["concurrency"] for v in ver["levels"]] == [1, 2, 4, 8, 16, 32]
    assert applied(ver) and all(v["verdict"] in VERDICTS for v in ver["levels"]), [
        (v["concurrency"], v["throughput"], v["best_of_both"], v["verdict"]) for v in ver["levels"]]
    md = (out / "report.md").read_text()
    assert says_its_verdict(md)
    assert len(exp["files"]["plots"]) == 4 and all((out / p).stat().st_size > 10_000 for p in exp["files"]["plots"])
    # the hand-started baseline was cleared (verified) before the first deployment came up
    first = json.loads(sorted((out / "transitions").glob("000-*.json"))[0].read_text())
    assert first["action"] == "up" and first["result"]["cleared"]["ok"]
    assert not demo_env.held()
    # everything verified stopped: its temporary folder (the units' state) is gone
    assert not list((tmp_path / "tmp").glob("gpuslate-demo-*"))
    # one throughput figure, said once what it is: the progress lines show the report's (modelled)
    assert r.stderr.count("throughputs are in modelled time") == 1
    point = json.loads((out / "points" / "baseline__c00001__r00.json").read_text())
    shown = re.search(r"baseline c=1 repeat 1: ([0-9.]+) tok/s", r.stderr)
    assert shown and float(shown.group(1)) == pytest.approx(point["level"]["output_token_throughput"] / 5, abs=0.1)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_demo_interrupted_leaves_nothing_running(demo_env, tmp_path, sig):
    out = tmp_path / "demo"
    proc = popen_cli("--sim", str(demo_env.root), "demo", "--quick", "--out", str(out))
    wait_for(lambda: len(list((out / "points").glob("*.json"))) >= 2 or proc.poll() is not None, timeout=60,
             interval=0.01)
    assert proc.poll() is None
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == (143 if sig == signal.SIGTERM else 130), err
    assert "Traceback" not in err
    assert "8/8 GPUs verified free" in err and "partial results" in err
    assert not demo_env.held()
    assert not list((tmp_path / "tmp").glob("gpuslate-demo-*"))  # removed, once verified stopped


def test_demo_refuses_a_foreign_out_dir(demo_env, cli, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    r = cli("--sim", str(demo_env.root), "demo", "--quick", "--out", str(out))
    assert r.returncode == 2 and "does not hold a previous demo" in r.stderr
    assert (out / "notes.txt").read_text() == "keep me" and not demo_env.held()
