"""Issue 26's done-when: an experiment whose speculative deployment is declared as a vLLM command
(``vllm serve MODEL --speculative-config '{...}'``) or an SGLang command (``python -m
sglang.launch_server ... --speculative-algorithm EAGLE3 --speculative-num-steps 3``) writes complete,
conforming files and the whole command lines, runs that command line as its own deployment
(``verify``) and reports per level whether it matches the better of baseline and speculative; one
repeat first (too little evidence: nothing written, the report says what to run), then the
``--resume`` with more repeats it says.

The engines are stand-ins named like them (engine_shims.py: a ``vllm`` on PATH, an ``sglang``
package) that run ``gpuslate sim serve --emulate``, which reads the engine's arguments by the
engine's rules and reports the engine's version where the engine does (vLLM ``/version``, SGLang
``/get_server_info``): the version recorded in the points is what the running server said."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import jsonschema
import pytest

from engine_facts import sglang_flat_loader, sglang_keyed_slots, sglang_route, vllm_check_config, vllm_lookup
from engine_shims import engine_spec, install
from expkit import applied, free_port, kill_leftovers, says_its_verdict, until_located

pytestmark = [pytest.mark.slow, pytest.mark.timing]  # whole experiments (two deployments and the recommendation's run)

SRC = str(Path(__file__).resolve().parents[2] / "src")
SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "docs/schemas/experiment.v1.json").read_text())


@pytest.fixture
def exp_host(sim_host, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUSLATE_LOCK_DIR", str(tmp_path / "locks"))
    yield sim_host
    kill_leftovers(sim_host, [tmp_path / "state"])


def run(cli, tmp_path: Path, engine: str) -> tuple[dict, Path]:
    """The experiment of ``engine``'s two deployments, measured again where a loaded machine's
    noise hid the crossover (expkit.until_located); its summary and folder."""
    env = install(tmp_path / "shims")
    spec = engine_spec(tmp_path / f"{engine}.toml", free_port(), engine, shim_py=env["GPUSLATE_TEST_SHIM_PY"],
                       src=SRC)

    def measure(attempt: int) -> dict:
        out = tmp_path / f"out{attempt}"
        r = cli("experiment", "run", str(spec), "--out", str(out), "--json", env={"PATH": env["PATH"]}, timeout=150)
        assert r.returncode == 0, r.stderr[-3000:]
        doc = json.loads(r.stdout)
        jsonschema.validate(doc, SCHEMA)
        return {**doc, "_out": out}

    doc = until_located(measure)
    return doc, doc.pop("_out")



def test_vllm_command(exp_host, cli, tmp_path):
    """First with one repeat (as after a Ctrl-C early on): nothing recommended, nothing written, and
    the report says what to run; then that (--resume with [load] repeats = 2), and the rest."""
    env = install(tmp_path / "shims")
    port = free_port()
    spec = engine_spec(tmp_path / "v.toml", port, "vllm", repeats=1)
    out = tmp_path / "out"
    r = cli("experiment", "run", str(spec), "--out", str(out), "--json", env={"PATH": env["PATH"]}, timeout=150)
    assert r.returncode == 0, r.stderr[-3000:]
    first = json.loads(r.stdout)
    rec = first["recommendation"]
    assert not rec["recommended"] and rec["apply"]["status"] == "not_recommended" and first["files"]["engines"] == []
    assert rec["next"] == f"to decide: set [load] repeats = 2 in {spec}, then run gpuslate experiment run {spec} " \
                          f"--out {out} --resume"
    assert "verification skipped: no threshold recommended" in first["verification_note"]
    engine_spec(spec, port, "vllm", repeats=2)  # what the report said to do

    def measure(attempt: int) -> dict:
        """The resume the report said to run; measured again, from nothing, where a loaded
        machine's noise hid the crossover (expkit.until_located)."""
        nonlocal out
        if attempt:
            out = tmp_path / f"out{attempt}"
        r = cli("experiment", "run", str(spec), "--out", str(out), "--json", *([] if attempt else ["--resume"]),
                env={"PATH": env["PATH"]}, timeout=150)
        assert r.returncode == 0, r.stderr[-3000:]
        doc = json.loads(r.stdout)
        jsonschema.validate(doc, SCHEMA)
        assert doc["run"]["points_skipped"] == (0 if attempt else 4) and doc["complete"]
        return doc

    doc = until_located(measure)
    rec = doc["recommendation"]
    assert rec["recommended"] and rec["decision"] == "disable_above" and rec["threshold"] == 1, rec["summary"]
    apply = rec["apply"]
    assert apply["status"] == "ready" and apply["engine"] == "vllm"
    # the engine's version, asked of the running server during the experiment and recorded
    assert apply["version"] == "0.25.0" and apply["version_status"] == "has_knob"
    point = json.loads((out / "points" / "speculative__c00001__r00.json").read_text())
    assert point["engine"]["engine"] == "vllm" and point["engine"]["version"] == "0.25.0"
    # complete: method, model and K kept, the schedule added; vLLM's rules hold
    cfg = json.loads((out / "vllm-speculative-config.json").read_text())
    assert cfg == {"method": "eagle3", "model": "org/eagle3-draft", "num_speculative_tokens": 3,
                   "num_speculative_tokens_per_batch_size": [[1, 1, 3], [2, 4, 0]]}
    vllm_check_config(cfg)
    assert vllm_lookup(cfg["num_speculative_tokens_per_batch_size"], 64, 3)[1:5] == [3, 0, 0, 0]
    # the whole command line: the deployment's own, with the config replaced
    measured = next(d["command"] for d in doc["deployments"] if d["role"] == "speculative")
    line = shlex.split((out / "recommended-command.txt").read_text())
    i = measured.index("--speculative-config")
    assert line[:i] == measured[:i] and json.loads(line[i + 1]) == cfg and line[i + 2:] == measured[i + 2:]
    assert not (out / "vllm-config.json").exists() and not (out / "sim-args.txt").exists()
    # ... and that command line ran as its own deployment, level by level against the better of the two, and
    # across its switch (1, 2 and 4: T, T+1 though not a measured level, the level above) with both
    ver = doc["verification"]
    assert ver["command"] == line and ver["threshold"] == 1 and [v["concurrency"] for v in ver["levels"]] == [1, 2, 4]
    assert [v["compared_with"] for v in ver["levels"]] == [["baseline", "speculative"]] * 3
    assert applied(ver), ver["levels"]
    assert [r["concurrency"] for r in ver["switch"]] == [1, 2, 4] and ver["collapsed_at"] == [], ver["switch"]
    assert ver["engine"]["spec_disable_threshold"] == 1  # what the running server made of the schedule
    md = (out / "report.md").read_text()
    assert "### Applying it (vLLM)" in md and "Measured: vLLM with a fixed K = 3" in md and "Unproven:" in md
    assert "## The recommendation's own run" in md and says_its_verdict(md)


def test_sglang_command(exp_host, cli, tmp_path):
    doc, out = run(cli, tmp_path, "sglang")
    rec = doc["recommendation"]
    assert rec["recommended"] and rec["threshold"] == 1, rec["summary"]
    apply = rec["apply"]
    assert apply["status"] == "ready" and apply["engine"] == "sglang" and apply["version"] == "0.5.11"
    cfg = json.loads((out / "sglang-adaptive-config.json").read_text())
    slots = sglang_keyed_slots(cfg)
    assert [slots[sglang_route(slots, b)] for b in (1, 2, 4, 64)] == [[3], [0], [0], [0]]  # the measured 3 steps
    with pytest.raises(AssertionError):
        sglang_flat_loader(cfg, 3, add_initial=True)
    args = shlex.split((out / "sglang-args.txt").read_text())
    assert args == ["--speculative-adaptive", "--speculative-adaptive-config", str(out / "sglang-adaptive-config.json")]
    measured = next(d["command"] for d in doc["deployments"] if d["role"] == "speculative")
    assert shlex.split((out / "recommended-command.txt").read_text()) == measured + args
    ver = doc["verification"]
    assert applied(ver), ver["levels"]
    # the running SGLang (stand-in) took the adaptive mode, and routed as the keys say
    assert ver["engine"]["speculative_adaptive"] is True and ver["engine"]["spec_disable_threshold"] == 1
    md = (out / "report.md").read_text()
    assert "### Applying it (SGLang)" in md and "draft model's extend" in md and "#24055" in md


def test_a_patched_engines_own_flag(exp_host, cli, tmp_path):
    """The seed's engineer patched SGLang with --speculative-disable-batch-threshold N: the experiment
    names that flag on its speculative unit, and the recommendation is that deployment's command with
    the flag set to T (the value it ran with replaced), run and proven like any other; the report says
    it relies on a patch. The stand-ins are patched SGLangs (sim serve --patched-flag)."""
    flag = "--speculative-disable-batch-threshold"
    env = install(tmp_path / "shims", patched_flag=flag)
    spec = engine_spec(tmp_path / "p.toml", free_port(), "sglang", shim_py=env["GPUSLATE_TEST_SHIM_PY"], src=SRC,
                       extra=(flag, "1024"), threshold_flag=flag)
    out = tmp_path / "out"
    r = cli("experiment", "run", str(spec), "--out", str(out), "--json", env={"PATH": env["PATH"]}, timeout=150)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, SCHEMA)
    rec = doc["recommendation"]
    assert rec["recommended"] and rec["threshold"] == 1, rec["summary"]
    apply = rec["apply"]
    assert apply["status"] == "ready" and apply["patched_flag"] == flag and doc["files"]["engines"] == [
        "recommended-command.txt"]  # the patched engine's own flag: no upstream file
    measured = next(d["command"] for d in doc["deployments"] if d["role"] == "speculative")
    line = shlex.split((out / "recommended-command.txt").read_text())
    i = measured.index(flag)
    assert line == [*measured[:i + 1], "1", *measured[i + 2:]]  # 1024 replaced by T, in place
    ver = doc["verification"]
    assert ver["command"] == line and applied(ver), ver["levels"]
    assert ver["engine"]["spec_disable_threshold"] == 1 and ver["engine"]["patched_flag"] == flag
    assert ver["collapsed_at"] == []
    md = (out / "report.md").read_text()
    assert f"Relies on a patch: {flag} is the patched engine's own flag" in md


def test_a_collapse_at_the_switch_withdraws_the_recommendation(exp_host, cli, tmp_path):
    """vLLM issue #49548's shape, played by the simulator's switch cost (--switch-ms: a step whose kind
    differs from the one before pays it): the recommendation wins nowhere it switches, and where its
    batch moves across the threshold (T+1 = 2) it falls below both deployments. Its own run shows it
    with the figures, and the recommendation is withdrawn: not recommended, no files, the reason."""
    env = install(tmp_path / "shims", sim=("--switch-ms", "60"))
    spec = engine_spec(tmp_path / "c.toml", free_port(), "sglang", shim_py=env["GPUSLATE_TEST_SHIM_PY"], src=SRC)
    out = tmp_path / "out"
    r = cli("experiment", "run", str(spec), "--out", str(out), "--json", env={"PATH": env["PATH"]}, timeout=150)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, SCHEMA)
    ver = doc["verification"]
    assert [row["concurrency"] for row in ver["switch"]] == [1, 2, 4]  # T, T+1 (not a measured level), above
    assert 2 in ver["collapsed_at"], ver["switch"]
    row = next(row for row in ver["switch"] if row["concurrency"] == 2)
    assert row["interval"][1] < 1 and row["throughput"] < row["worse_of_both"]
    assert ver["engine"]["switch_ms"] == 60 and ver["engine"]["spec_disable_threshold"] == 1
    rec = doc["recommendation"]
    assert not rec["recommended"] and rec["threshold"] == 1 and rec["withdrawn"]["levels"] == ver["collapsed_at"]
    assert rec["apply"]["status"] == "withdrawn" and rec["apply"]["files"] == {} and doc["files"]["engines"] == []
    assert not (out / "sglang-adaptive-config.json").exists() and not (out / "recommended-command.txt").exists()
    assert rec["summary"].startswith("withdrawn") and "collapsed at the switch" in rec["summary"]
    md = (out / "report.md").read_text()
    assert "### Across the switch" in md and "It collapsed at concurrency 2" in md and "| collapse |" in md
    assert "Nothing is written: the recommendation's own run collapsed at the switch" in md
