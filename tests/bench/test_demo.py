"""gpuslate demo --quick end to end on a simulated 8-GPU host: the hand-started baseline cleared,
an emulated SGLang baseline and SGLang EAGLE-3 (the seed's flags) swept, the recommendation in
SGLang's own files and command, its own run (across the switch too), plots, and nothing left
running; also after a real SIGINT or SIGTERM midway; ``--engine trtllm`` tells the same story in
TensorRT-LLM's form (its options file held against TensorRT-LLM's rules, engine_facts.py)."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import jsonschema
import pytest

from engine_facts import sglang_flat_loader, sglang_keyed_slots, sglang_route, trtllm_lookup, trtllm_validate
from expkit import applied, kill_leftovers, popen_cli, says_its_verdict
from gpuslate.bench.report import DemoResult
from gpuslate.engines import detect
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
    # the seed's story: SGLang's own command lines, EAGLE-3 with a draft model, steps, topk 1, draft tokens
    assert doc["engine"] == "sglang" and doc["emulated"]
    specd = exp["deployments"][1]
    assert detect(specd["command"])[0].name == "sglang" and specd["engine"]["simulated"]
    assert specd["engine"]["engine"] == "sglang" and specd["engine"]["version"] == "0.5.11"
    for flag, value in (("--speculative-algorithm", "EAGLE3"), ("--speculative-eagle-topk", "1"),
                        ("--speculative-num-steps", "3"), ("--speculative-num-draft-tokens", "4")):
        assert specd["command"][specd["command"].index(flag) + 1] == value
    assert "--speculative-draft-model-path" in specd["command"] and "--tp-size" in specd["command"]
    # the seed's shape: EAGLE-3 ahead at concurrency 1 only, the baseline far ahead at 32
    tok = {(r["deployment"], r["concurrency"]): r["output_token_throughput"]["mean"] for r in exp["levels"]}
    assert tok[("speculative", 1)] > tok[("baseline", 1)] and tok[("baseline", 32)] > 1.7 * tok[("speculative", 32)]
    rec = exp["recommendation"]
    assert rec["recommended"] and rec["threshold"] == 1 and rec["crossover"] == [1, 2], rec
    assert rec["apply"]["status"] == "ready" and rec["apply"]["engine"] == "sglang"
    assert exp["files"]["engines"] == ["recommended-command.txt", "sglang-adaptive-config.json", "sglang-args.txt"]
    # SGLang's own files, held against its loaders (engine_facts.py)
    cfg = json.loads((out / "sglang-adaptive-config.json").read_text())
    slots = sglang_keyed_slots(cfg)
    assert [slots[sglang_route(slots, b)] for b in (1, 2, 4, 64)] == [[3], [0], [0], [0]]
    with pytest.raises(AssertionError):
        sglang_flat_loader(cfg, 3, add_initial=True)
    # the recommendation's own run: the speculative deployment with SGLang's adaptive config, against the
    # better of the two at every level (the one that won it), matching it within drift + noise
    ver = exp["verification"]
    assert ver["threshold"] == 1 and ver["command"][-3:] == [
        "--speculative-adaptive", "--speculative-adaptive-config", str(out / "sglang-adaptive-config.json")]
    assert ver["engine"]["speculative_adaptive"] is True and ver["engine"]["spec_disable_threshold"] == 1
    assert [v["concurrency"] for v in ver["levels"]] == [1, 2, 4, 8, 16, 32]
    assert applied(ver) and all(v["verdict"] in VERDICTS for v in ver["levels"]), [
        (v["concurrency"], v["throughput"], v["best_of_both"], v["verdict"]) for v in ver["levels"]]
    # across the switch (T, T+1, the level above), with both deployments: no collapse
    assert [r["concurrency"] for r in ver["switch"]] == [1, 2, 4] and ver["collapsed_at"] == [], ver["switch"]
    md = (out / "report.md").read_text()
    assert says_its_verdict(md) and "### Across the switch" in md
    assert "The engines were emulated" in md and "sglang 0.5.11 (emulated)" in md
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
    # the time left counts the verification from the first point: its points estimated (~) until it is
    # planned, then exact; never the sweep's 24 alone, jumping to the whole run's when the sweep ends
    totals = re.findall(r"\| points (\d+)/(~?)(\d+) \|", r.stderr)
    estimated = [int(t) for _, mark, t in totals if mark]
    exact = [int(t) for _, mark, t in totals if not mark]
    assert estimated and exact and estimated[0] == exact[-1] == int(totals[-1][0]) > 24, totals


def test_demo_quick_in_trtllm_form(demo_env, cli, tmp_path):
    """The same story told in TensorRT-LLM's form: trtllm-serve command lines, EAGLE-3 in an options
    file; the recommendation is that file with draft_len_schedule, as TensorRT-LLM validates and reads it."""
    import yaml

    out = tmp_path / "demo"
    r = cli("--sim", str(demo_env.root), "demo", "--quick", "--engine", "trtllm", "--out", str(out), "--json",
            timeout=110)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    exp = doc["experiment"]
    assert doc["engine"] == "trtllm" and doc["clean"]["ok"]
    specd = exp["deployments"][1]
    assert detect(specd["command"])[0].name == "trtllm" and specd["engine"]["engine"] == "trtllm"
    rec = exp["recommendation"]
    assert rec["recommended"] and rec["threshold"] == 1, rec["summary"]
    assert exp["files"]["engines"] == ["recommended-command.txt", "trtllm-extra-llm-api-options.yaml"]
    written = yaml.safe_load((out / "trtllm-extra-llm-api-options.yaml").read_text())
    spec = written["speculative_config"]
    assert spec["decoding_type"] == "Eagle3" and spec["max_draft_len"] == 3 and "max_concurrency" not in spec
    schedule = trtllm_validate(spec["draft_len_schedule"], spec["max_draft_len"])
    for rule in ("upper", "lower"):  # both ways TensorRT-LLM has read the keys
        assert [trtllm_lookup(schedule, b, rule) for b in (1, 2, 4, 64)] == [3, 0, 0, 0]
    ver = exp["verification"]
    assert ver["command"][-2:] == ["--extra_llm_api_options", str(out / "trtllm-extra-llm-api-options.yaml")]
    assert applied(ver) and ver["engine"]["spec_disable_threshold"] == 1 and ver["collapsed_at"] == []
    assert "The engines were emulated" in (out / "report.md").read_text()
    assert not demo_env.held()


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
