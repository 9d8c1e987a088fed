"""`gpuslate bench` as a real command against a real `gpuslate sim serve`."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import gpuslate_env, run_cli, wait_for
from simproc import SimProc, sim_serve

pytestmark = pytest.mark.timeout(90)

SCHEMA = json.loads((Path(__file__).parents[2] / "docs" / "schemas" / "bench.v1.json").read_text())


@pytest.fixture(scope="module")
def sim() -> SimProc:  # type: ignore[misc]
    with sim_serve("--time-scale", "50") as s:
        yield s


def test_json_document_validates(sim: SimProc, tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    out = tmp_path / "run.json"
    r = run_cli("bench", sim.url + "/v1", "-c", "1,3", "-n", "6", "--input-len", "10", "--output-len", "12",
                "--warmup", "2", "--json", "--out", str(out))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert json.loads(out.read_text()) == doc
    assert doc["schema"] == "gpuslate.bench.v1" and doc["ok"] and doc["url"] == sim.url
    assert [lv["concurrency"] for lv in doc["levels"]] == [1, 3]
    for lv in doc["levels"]:
        assert lv["completed"] == 6 and lv["failed"] == 0 and lv["output_tokens"] == 72
        assert lv["ttft_ms"]["p99"] >= lv["ttft_ms"]["p50"] > 0


def test_chat_poisson_and_failures_validate(sim: SimProc) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    r = run_cli("bench", sim.url, "--api", "chat", "--request-rate", "100", "--max-concurrency", "2",
                "-n", "5", "--input-len", "4", "--output-len", "4", "--json")
    assert r.returncode == 0, r.stderr
    jsonschema.validate(json.loads(r.stdout), SCHEMA)
    r = run_cli("bench", sim.url, "--model", "other", "-n", "2", "--output-len", "2", "--json")
    assert r.returncode == 6, r.stderr  # nothing succeeded
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert doc["levels"][0]["errors"] == {"HTTP 404: The model `other` does not exist.": 2}
    assert "no request succeeded" in r.stderr


def test_table_for_people(sim: SimProc) -> None:
    r = run_cli("bench", sim.url, "-c", "2", "-n", "4", "--input-len", "8", "--output-len", "8")
    assert r.returncode == 0, r.stderr
    assert "sim-model at " + sim.url in r.stdout
    header = next(line for line in r.stdout.splitlines() if "Out tok/s" in line)
    assert "TTFT ms" in header and "ITL ms" in header
    assert "Traceback" not in r.stderr
    # a simulator at --time-scale 50 says that its figures are scaled (its /get_server_info tells)
    assert "scaled figures: the server simulates its model 50x faster than modelled" in " ".join(r.stdout.split())


BAD = [
    (["-c", "0"], "invalid concurrency 0"),
    (["-c", "-1"], "invalid concurrency"),
    (["-c", "a"], "invalid concurrency 'a'"),
    (["-c", ""], "invalid concurrency list"),
    (["-c", "100000000"], "invalid concurrency 100000000"),
    (["--request-rate", "0"], "request rate"),
    (["--request-rate", "nan"], "request rate"),
    (["--request-rate", "x"], "invalid rate 'x'"),
    (["--burstiness", "2"], "--burstiness needs --request-rate"),
    (["--request-rate", "1", "--burstiness", "0"], "burstiness must be"),
    (["--request-rate", "inf", "--duration", "1"], "give --requests"),
    (["--goodput", "ttft:0"], "invalid --goodput item 'ttft:0'"),
    (["--goodput", "latency:5"], "invalid --goodput item 'latency:5'"),
    (["--percentiles", "50,101"], "invalid --percentiles"),
    (["--random-range-ratio", "1"], "random range ratio"),
    (["--extra-body", "[1]"], "expected a JSON object"),
    (["--extra-body", "{"], "invalid --extra-body: not JSON"),
    (["--header", "nocolon"], "invalid --header 'nocolon'"),
    (["--tokenizer", "/nonexistent/tok"], "nothing is downloaded"),
    (["--max-concurrency", "4"], "--max-concurrency needs --request-rate"),
    (["--requests", "0"], "requests must be"),
    (["--duration", "-1"], "argument --duration: invalid duration '-1': must be greater than 0"),
    (["--duration", "5x"], "argument --duration: invalid duration '5x': expected seconds (90), or with units"),
    (["--input-len", "0"], "input length"),
    (["--output-len", "9999999999"], "output length"),
    (["--timeout", "0"], "argument --timeout: invalid duration '0': must be greater than 0"),
    (["--dataset", "/nonexistent.jsonl"], "no such dataset file"),
    (["--out", "/nonexistent/dir/x.json"], "does not exist"),
]


@pytest.mark.parametrize(("args", "message"), BAD)
def test_bad_input_exits_2_with_one_line_and_sends_nothing(sim: SimProc, args: list[str], message: str) -> None:
    before = sim.counters()["requests_submitted"]
    r = run_cli("bench", sim.url, *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1 and message in r.stderr, r.stderr
    assert r.stdout == ""
    assert sim.counters()["requests_submitted"] == before


@pytest.mark.parametrize("url", ["not-a-url", "ftp://127.0.0.1:1", "http://127.0.0.1:99999", "http://h/?x=1"])
def test_bad_url_exits_2(url: str) -> None:
    r = run_cli("bench", url)
    assert r.returncode == 2 and r.stderr.startswith("gpuslate: error: invalid URL"), r.stderr


def test_unreachable_server_exits_6_with_its_own_message() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        r = run_cli("bench", url, "--json")
    assert r.returncode == 6
    assert f"cannot reach the server at {url}: connection refused" in r.stderr
    assert json.loads(r.stdout)["error"]["type"] == "server_failed"


def test_some_failed_exits_7_all_failed_exits_6(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "a" * 40}) + "\n" + json.dumps({"prompt": "b" * 2000}) + "\n")
    with sim_serve("--time-scale", "100", "--context-length", "300") as sim:  # a prompt too long: a 400
        mixed = run_cli("bench", sim.url, "-n", "4", "--dataset", str(data), "--output-len", "8", "--json")
        assert mixed.returncode == 7, mixed.stderr
        (lv,) = json.loads(mixed.stdout)["levels"]
        assert lv["completed"] == 2 and lv["failed"] == 2
    with sim_serve("--time-scale", "1") as sim:
        # a per-request time limit a hundred times below the generation time (1.2 s): everything
        # fails, however the machine's load delays the server or the client
        slow = run_cli("bench", sim.url, "-n", "1", "--output-len", "250", "--input-len", "4",
                       "--timeout", "0.01", "--json")
        assert slow.returncode == 6
        assert json.loads(slow.stdout)["levels"][0]["errors"] == {"timeout after 0.01 s": 1}


def test_ctrl_c_prints_partial_results_and_exits_130(tmp_path: Path) -> None:
    with sim_serve("--time-scale", "20") as sim:
        proc = subprocess.Popen([sys.executable, "-m", "gpuslate", "bench", sim.url, "-c", "2,4", "-n", "100000",
                                 "--input-len", "8", "--output-len", "16", "--json"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=gpuslate_env())
        try:
            wait_for(lambda: sim.counters()["requests_finished"] >= 10, timeout=30)
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 130, err
        doc = json.loads(out)
        assert doc["interrupted"] and not doc["ok"]
        (lv,) = doc["levels"]
        assert lv["interrupted"] and lv["completed"] >= 5 and lv["failed"] == 0
        assert "interrupted" in err and "Traceback" not in err
        # the abandoned requests were aborted on the server
        wait_for(lambda: sim.counters()["running"] == 0, timeout=10)


@pytest.mark.parametrize("bound", [["-n", "40"], ["--duration", "1"]], ids=["requests", "duration"])
def test_progress_bar_on_a_terminal(sim: SimProc, bound: list[str]) -> None:
    # a pseudo-terminal on stderr: the bar is drawn there, stdout keeps the table; a level bounded
    # by time counts what is done, never "36/?"
    import os
    import pty

    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "gpuslate", "bench", sim.url, "-c", "1", *bound,
                                 "--input-len", "4", "--output-len", "40"],
                                stdout=subprocess.PIPE, stderr=slave, text=True, env=gpuslate_env())
        os.close(slave)
        out, _ = proc.communicate(timeout=60)
        seen = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(master)
    assert proc.returncode == 0
    assert b"level 1/1 c=1" in seen
    assert "Out tok/s" in out
    assert b"/?" not in seen and (b"/40" in seen if bound[0] == "-n" else b" done" in seen), seen[-400:]
