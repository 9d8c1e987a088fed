"""experiment run/report against real simulated servers swapped as units on a simulated host:
points written as they finish, a real SIGINT midway then --resume gives the same summary as an
uninterrupted run, the recommendation finds the crossover the performance model implies."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
import threading
from pathlib import Path

import jsonschema
import pytest

from expkit import (
    LEVELS,
    abstains,
    deterministic,
    free_port,
    kill_leftovers,
    located,
    popen_cli,
    until_located,
    write_spec,
)
from gpuslate.cli.main import main
from gpuslate.simserver.perfmodel import throughput
from helpers import count_host_opens, gpuslate_env, unit_records, wait_for

pytestmark = pytest.mark.slow  # the whole file: whole experiment runs against simulated servers


@pytest.fixture
def exp_host(sim_host, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUSLATE_LOCK_DIR", str(tmp_path / "locks"))
    yield sim_host
    kill_leftovers(sim_host, [tmp_path / "state"])


SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "docs/schemas/experiment.v1.json").read_text())


def implied_threshold() -> int:
    return max(c for c in LEVELS if throughput("speculative", c) > throughput("baseline", c))


@pytest.mark.timing  # the recommendation of both runs is measured: alone, not beside other tests
def test_interrupted_and_resumed_equals_uninterrupted(exp_host, cli, tmp_path):
    spec = write_spec(tmp_path / "exp.toml", free_port())

    def measure(attempt: int) -> dict:
        full = cli("experiment", "run", str(spec), "--out", str(tmp_path / f"full{attempt}"), "--json", timeout=110)
        assert full.returncode == 0, full.stderr
        return json.loads(full.stdout)

    whole = until_located(measure)
    jsonschema.validate(whole, SCHEMA)
    assert whole["schema"] == "gpuslate.experiment.v1" and whole["complete"]
    assert whole["run"]["points_run"] == 2 * len(LEVELS) * 2 and whole["run"]["points_skipped"] == 0
    # interleaved: repeat 1 sweeps baseline then speculative, repeat 2 speculative then baseline
    assert [t["action"] for t in whole["run"]["transitions"]] == ["up", "swap", "swap", "down"]
    assert [t["deployment"] for t in whole["run"]["transitions"]] == ["baseline", "speculative", "baseline",
                                                                     "baseline"]
    assert whole["order"] == "interleaved" and whole["drift"]["drift"] is not None
    assert all(t["ok"] for t in whole["run"]["transitions"])
    # the crossover the performance model implies (between 1 and 2 with the defaults)
    rec = whole["recommendation"]
    assert rec["decision"] == "disable_above" and rec["threshold"] == implied_threshold() == 1, rec
    assert rec["crossover"] == [1, 2]
    assert rec["engines"]["vllm_speculative_config"]["num_speculative_tokens_per_batch_size"] == [[1, 1, 3],
                                                                                                   [2, 4, 0]]
    assert not exp_host.held()  # the last deployment was stopped and its memory released

    out = tmp_path / "part"
    proc = popen_cli("experiment", "run", str(spec), "--out", str(out))
    # interrupt inside the second deployment's first sweep: baseline's first repeat is written
    wait_for(lambda: len(list((out / "points").glob("speculative__*.json"))) >= 1, timeout=60, interval=0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted" in err and "--resume" in err
    assert not exp_host.held()  # the running deployment was stopped, memory verified released
    kept = len(list((out / "points").glob("*.json")))
    assert len(LEVELS) < kept < 2 * len(LEVELS) * 2
    assert not list((out / "points").glob(".*"))  # no half-written point

    again = cli("experiment", "run", str(spec), "--out", str(out), "--json", "--resume", timeout=110)
    assert again.returncode == 0, again.stderr
    resumed = json.loads(again.stdout)
    assert resumed["run"]["points_skipped"] == kept
    assert resumed["run"]["points_run"] == 2 * len(LEVELS) * 2 - kept
    actions = [t["action"] for t in resumed["run"]["transitions"]]
    assert actions[0] == "up" and actions[-1] == "down"
    assert resumed["run"]["transitions"][0]["deployment"] == "speculative"  # baseline's first sweep not redone
    assert deterministic(resumed) == deterministic(whole)
    # what it decides from the measured figures: the same crossover, or an abstention where the
    # machine's load hid it (see expkit.until_located); never another threshold
    assert located(resumed) or abstains(resumed), resumed["recommendation"]

    # the report alone gives the same summary, and its files are there
    rep = cli("experiment", "report", str(out), "--json")
    assert rep.returncode == 0, rep.stderr
    report_doc = json.loads(rep.stdout)
    jsonschema.validate(report_doc, SCHEMA)
    assert deterministic(report_doc) == deterministic(whole)
    assert report_doc["recommendation"] == resumed["recommendation"]  # the report decides as the run did
    assert json.loads((out / "summary.json").read_text())["levels"] == report_doc["levels"]
    for name in ("report.md", "summary.json", "summary.csv", "throughput_vs_concurrency.png"):
        assert (out / name).is_file(), name
    assert (out / "report.md").read_text().count("### Concurrency") == len(LEVELS)
    assert len((out / "summary.csv").read_text().splitlines()) == 1 + 2 * len(LEVELS)
    point = json.loads((out / "points" / "baseline__c00001__r00.json").read_text())
    assert point["command"][-2:] == ["--time-scale", "10"] and point["gpuslate_version"]
    assert point["engine"]["engine"] == "gpuslate-sim"
    assert len(point["gpu_state_before"]["gpus"]) == 8
    assert all(len(g["processes"]) == 1 for g in point["gpu_state_before"]["gpus"])  # the server's workers


def test_resume_refuses_another_spec_and_existing_dir(exp_host, cli, tmp_path):
    spec = write_spec(tmp_path / "exp.toml", free_port(), requests=4, repeats=1)
    out = tmp_path / "o"
    out.mkdir()
    (out / "x").write_text("mine")
    r = cli("experiment", "run", str(spec), "--out", str(out))
    assert r.returncode == 2 and "not an experiment folder" in r.stderr
    assert not exp_host.held()
    (out / "x").unlink()
    (out / "experiment.json").write_text(json.dumps({"identity": {"other": 1}}))
    r = cli("experiment", "run", str(spec), "--out", str(out))
    assert r.returncode == 2 and "--resume" in r.stderr
    r = cli("experiment", "run", str(spec), "--out", str(out), "--resume")
    assert r.returncode == 2 and "same spec" in r.stderr
    r = cli("experiment", "report", str(tmp_path))
    assert r.returncode == 2 and "not an experiment folder" in r.stderr


@pytest.mark.parametrize("lines", [3, 6])
def test_a_reader_gone_stops_the_run_and_says_so(exp_host, cli, tmp_path, lines):
    """``experiment run SPEC 2>&1 | head -N`` (issue 25): it used to stop everything, write no report and
    exit 0. Cut short, it stops its servers, verifies the GPUs, keeps its points, and exits 141 (the
    --resume line could not be written: stderr is the broken pipe); --resume then finishes it."""
    spec = write_spec(tmp_path / "exp.toml", free_port(), requests=4, repeats=1)
    out = tmp_path / "cut"
    proc = subprocess.Popen([sys.executable, "-m", "gpuslate", "experiment", "run", str(spec), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=gpuslate_env(),
                            start_new_session=True)
    shown = [proc.stdout.readline() for _ in range(lines)]
    proc.stdout.close()  # head -N exits
    assert proc.wait(90) == 141, shown
    assert all(b"Traceback" not in line for line in shown)
    assert not exp_host.held()  # the deployment it was running was stopped and verified
    assert not (out / "report.md").exists()
    kept = len(list((out / "points").glob("*.json"))) if (out / "points").is_dir() else 0
    assert kept < 2 * len(LEVELS)
    again = cli("experiment", "run", str(spec), "--out", str(out), "--resume", "--json", timeout=110)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["run"]["points_skipped"] == kept


def test_an_interrupt_in_a_stop_after_its_signals_still_verifies_the_gpus(exp_host, tmp_path):
    """Ctrl-C (or a lost output: the case above, on a loaded machine) right after the switch's stop
    signaled the first deployment, once its processes are gone: the run's cleanup still stops it (no
    process left to signal, its GPUs verified free, the unit stopped), and says so; it used to find
    nothing running and leave the memory unverified."""
    from gpuslate.api import Host
    from gpuslate.bench.experiment import run_experiment
    from gpuslate.bench.spec import load_spec
    from gpuslate.errors import Interrupted

    spec = load_spec(write_spec(tmp_path / "exp.toml", free_port(), requests=4, repeats=1))
    cut: list[str] = []

    def note(line: str) -> None:
        if line.startswith("SIGTERM sent") and not cut:
            cut.append(line)
            wait_for(lambda: not any(h.alive for h in exp_host.held()), timeout=30)  # its servers are gone
            raise KeyboardInterrupt

    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        with Host.open(str(exp_host.root), on_event=note) as host, pytest.raises(Interrupted) as info:
            run_experiment(host, spec, tmp_path / "o")
    finally:
        signal.signal(signal.SIGTERM, sigterm)
    assert cut and "t.baseline stopped and GPUs verified free" in str(info.value), info.value
    assert unit_records().load("t.baseline").phase == "stopped"
    assert not exp_host.held()


def test_deployment_that_fails_to_start_is_cleaned_up(exp_host, cli, tmp_path):
    spec = write_spec(tmp_path / "exp.toml", free_port(), requests=4, repeats=1)
    spec.write_text(spec.read_text().replace('"--mode", "speculative"]', '"--fail-startup"]'))
    r = cli("experiment", "run", str(spec), "--out", str(tmp_path / "o"), timeout=110)
    assert r.returncode == 6, r.stderr
    assert "speculative did not come up" in r.stderr and "Traceback" not in r.stderr
    assert not exp_host.held()
    assert len(list((tmp_path / "o" / "points").glob("baseline__*.json"))) == len(LEVELS)


def test_an_experiment_runs_on_one_host(exp_host, tmp_path, monkeypatch, capsys):
    """In process, counted: the run's up, swap and down and the GPU reading before every point
    go through the one Host the command opened (one backend, one audit log; the lock once a verb)."""
    spec = write_spec(tmp_path / "exp.toml", free_port(), requests=4, repeats=1)
    # a unit of the user's named like a deployment: the experiment's units are t.baseline, t.speculative
    users = unit_records()
    r = subprocess.run([sys.executable, "-m", "gpuslate", "up", "baseline", "--gpus", "7", "--ready-log", "ready",
                        "--", sys.executable, "-m", "gpuslate", "sim", "hold", "--gpus", "7", "--memory", "1GiB"],
                       capture_output=True, text=True, env=gpuslate_env(), timeout=60)
    assert r.returncode == 0, r.stderr
    assert subprocess.run([sys.executable, "-m", "gpuslate", "down", "baseline"], env=gpuslate_env(),
                          capture_output=True, timeout=60).returncode == 0
    mine = (users.units_dir() / "baseline.json").read_bytes()
    counts = count_host_opens(monkeypatch)
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        code = main(["experiment", "run", str(spec), "--out", str(tmp_path / "o"), "--json"])
    finally:
        signal.signal(signal.SIGTERM, sigterm)  # the command turns SIGTERM into an interrupt
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["run"]["points_run"] == 2 * len(LEVELS), doc
    actions = [json.loads(p.read_text())["action"] for p in sorted((tmp_path / "o" / "transitions").glob("*.json"))]
    assert actions == ["up", "swap", "down"], actions
    assert counts == {"backend": 1, "lock": 3, "audit": 1}, counts
    assert not exp_host.held()
    assert (users.units_dir() / "baseline.json").read_bytes() == mine  # untouched
    assert set(users.names()) == {"baseline", "t.baseline", "t.speculative"}
    assert users.load("t.speculative").phase == "stopped"


def test_progress_on_a_terminal(exp_host, tmp_path):
    """On a terminal, a live progress line (deployment, level, requests, points, elapsed) on stderr;
    the unit notes above it; the table on stdout."""
    spec = write_spec(tmp_path / "exp.toml", free_port(), requests=6, repeats=1)
    master, slave = pty.openpty()
    seen = bytearray()

    def drain() -> None:  # read while it runs: a full pty would block the writer
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                return
            if not chunk:
                return
            seen.extend(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        # 120 columns: the whole live line (a narrower one is said shorter: tests/cli/test_width.py)
        proc = subprocess.Popen([sys.executable, "-m", "gpuslate", "experiment", "run", str(spec), "--out",
                                 str(tmp_path / "o")], stdout=subprocess.PIPE, stderr=slave, text=True,
                                env=gpuslate_env({"COLUMNS": "120"}))
        os.close(slave)
        out, _ = proc.communicate(timeout=100)
        reader.join(10)
    finally:
        os.close(master)
    text = seen.decode(errors="replace")
    assert proc.returncode == 0, text
    assert "speculative (2/2) c=4 repeat 1" in text and "points 5/6" in text and "elapsed" in text
    assert "gpuslate: swap t.baseline -> t.speculative" in text and "Traceback" not in text
    assert "Recommendation:" in out and "concurrency 4" in out
    assert not exp_host.held()
