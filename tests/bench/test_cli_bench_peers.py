"""`gpuslate bench` with what its peers have (API key, extra body, goodput, percentiles, arrivals),
and how it ends: interrupts at any point, a server that goes away, output that is not cut.
Real commands against a real `gpuslate sim serve` (or a socket that never answers)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest

from helpers import gpuslate_env, run_cli, wait_for
from simproc import sim_serve, word_tokenizer

pytestmark = pytest.mark.timeout(90)

SCHEMA = json.loads((Path(__file__).parents[2] / "docs" / "schemas" / "bench.v1.json").read_text())


def bench_proc(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "gpuslate", "bench", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env or gpuslate_env())


def finish(proc: subprocess.Popen[str], timeout: float = 30) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_api_key_from_the_flag_or_the_environment() -> None:
    with sim_serve("--time-scale", "100", "--api-key", "sk-test") as sim:
        r = run_cli("bench", sim.url, "-n", "2", "--output-len", "4")
        assert r.returncode == 6 and "wants an API key" in r.stderr and "--api-key" in r.stderr, r.stderr
        r = run_cli("bench", sim.url, "-n", "2", "--output-len", "4", "--api-key", "sk-wrong")
        assert r.returncode == 6, r.stderr
        r = run_cli("bench", sim.url, "-n", "2", "--output-len", "4", "--api-key", "sk-test", "--json")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["levels"][0]["completed"] == 2 and doc["plan"]["api_key"] is True
        assert "sk-test" not in r.stdout  # the key is never written out
        env = {**gpuslate_env(), "OPENAI_API_KEY": "sk-test"}
        r = subprocess.run([sys.executable, "-m", "gpuslate", "bench", sim.url, "-n", "2", "--output-len", "4"],
                           capture_output=True, text=True, env=env, timeout=60)
        assert r.returncode == 0, r.stderr


def test_extra_body_reaches_the_server_and_headers_are_sent() -> None:
    with sim_serve("--time-scale", "100") as sim:
        # the simulator answers n=2 with vLLM's 400: proof that the extra body was merged in
        r = run_cli("bench", sim.url, "-n", "2", "--output-len", "4", "--extra-body", '{"n": 2}', "--json")
        assert r.returncode == 6
        assert json.loads(r.stdout)["levels"][0]["errors"] == {
            "HTTP 400: the simulator supports only n=1": 2}
        r = run_cli("bench", sim.url, "-n", "2", "--output-len", "4", "--extra-body", '{"top_p": 0.9}',
                    "--header", "X-Trace: abc", "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["plan"]["headers"] == ["X-Trace"]  # names only


def test_goodput_percentiles_peak_and_median_in_the_table() -> None:
    with sim_serve("--time-scale", "20") as sim:
        r = run_cli("bench", sim.url, "-c", "4", "-n", "16", "--output-len", "16", "--input-len", "8",
                    "--goodput", "ttft:100000,tpot:100000", "--percentiles", "25,99.9", "--json")
        assert r.returncode == 0, r.stderr
        jsonschema.validate(json.loads(r.stdout), SCHEMA)
        (lv,) = json.loads(r.stdout)["levels"]
        assert lv["slo_attainment"] == 1.0 and lv["goodput"] == pytest.approx(lv["request_throughput"])
        assert set(lv["itl_ms"]) == {"mean", "std", "max", "p50", "p90", "p99", "p25", "p99.9"}
        # a level shorter than a second: its peak is its mean (vLLM's partial bucket would say less)
        assert lv["duration_s"] < 1 and lv["output_tokens"] == 16 * 16
        assert lv["peak_output_token_throughput"] == pytest.approx(lv["output_token_throughput"], rel=1e-3)
        r = run_cli("bench", sim.url, "-c", "4", "-n", "16", "--output-len", "16", "--input-len", "8",
                    "--goodput", "ttft:0.001")
        assert r.returncode == 0 and "Goodput" in r.stdout and "(0%)" in r.stdout, r.stdout
        assert "latencies: median / p99" in r.stdout


@pytest.mark.timing  # the measured step time (under 1 ms): alone, after the parallel part
def test_itl_at_time_scale_10_is_the_scaled_step_not_zero() -> None:
    """A step of 0.48 ms (4.78 / 10) is shorter than the event loop's timer: steps due together are
    streamed as one chunk of several tokens, so ITL per token stays the step time, never 0."""
    with sim_serve("--time-scale", "10") as sim:
        r = run_cli("bench", sim.url, "-c", "1", "-n", "6", "--output-len", "128", "--input-len", "8", "--json")
    assert r.returncode == 0, r.stderr
    (lv,) = json.loads(r.stdout)["levels"]
    step_ms = lv["tpot_ms"]["mean"]
    assert 0.3 < step_ms < 0.8
    assert lv["itl_ms"]["p50"] > 0.5 * step_ms  # was 0.00: chunks of one token each, sent at once
    assert lv["peak_output_token_throughput"] >= lv["output_token_throughput"]


def test_table_is_not_cut_at_80_columns_when_piped() -> None:
    with sim_serve("--time-scale", "100") as sim:
        r = run_cli("bench", sim.url, "-c", "1,2", "-n", "4", "--output-len", "8", "--input-len", "4")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    head = next(line for line in lines if "Out tok/s" in line)
    assert "…" not in r.stdout and len(head) > 80
    assert "Chunk gap ms" in head and "Spec steps" in head and "Peak tok/s" in head


def test_request_rate_inf_and_burstiness() -> None:
    # ~0.2 s a request (48 steps of a batch of 8): connection set-up, however a loaded machine delays
    # it, is small beside it (with 8 tokens, 60 ms, it was not: 5.97 requests in flight, seen)
    with sim_serve("--time-scale", "2") as sim:
        r = run_cli("bench", sim.url, "--request-rate", "inf", "-n", "8", "--output-len", "48", "--json")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        jsonschema.validate(doc, SCHEMA)
        assert doc["plan"]["request_rate"] == "inf" and doc["levels"][0]["completed"] == 8
        # all at once: every request was in flight together
        assert doc["levels"][0]["achieved_concurrency"] > 6
        r = run_cli("bench", sim.url, "--request-rate", "100", "--burstiness", "0.5", "-n", "10",
                    "--output-len", "4", "--json")
        assert r.returncode == 0 and json.loads(r.stdout)["plan"]["burstiness"] == 0.5


def test_no_usage_is_said_on_stderr_and_a_tokenizer_makes_it_exact(tmp_path: Path) -> None:
    tok = word_tokenizer(tmp_path)
    with sim_serve("--time-scale", "50", "--no-stream-usage") as sim:
        r = run_cli("bench", sim.url, "-n", "4", "--output-len", "12", "--json")
        assert r.returncode == 0
        assert "ESTIMATED" in r.stderr and "--tokenizer" in r.stderr
        assert json.loads(r.stdout)["levels"][0]["token_source"] == "estimated"
        r = run_cli("bench", sim.url, "-n", "4", "--output-len", "12", "--tokenizer", str(tok), "--json")
        assert r.returncode == 0 and "ESTIMATED" not in r.stderr
        lv = json.loads(r.stdout)["levels"][0]
        assert lv["token_source"] == "tokenizer" and lv["output_tokens"] == 48


def test_repeating_prompts_are_warned_about(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(3)))
    with sim_serve("--time-scale", "100") as sim:
        r = run_cli("bench", sim.url, "-n", "10", "--dataset", str(data), "--output-len", "4")
    assert r.returncode == 0 and "prompts repeat" in r.stderr and "3 prompt(s)" in r.stderr


def test_sigterm_prints_finished_lists_in_flight_writes_out_exits_143(tmp_path: Path) -> None:
    out = tmp_path / "b.json"
    with sim_serve("--time-scale", "20") as sim:
        proc = bench_proc(sim.url, "-c", "4", "-n", "100000", "--input-len", "8", "--output-len", "64",
                          "--out", str(out))
        wait_for(lambda: sim.counters()["requests_finished"] >= 8, timeout=30)
        proc.send_signal(signal.SIGTERM)
        stdout, err = finish(proc)
    assert proc.returncode == 143, err
    assert "terminated" in err and "in flight" in err and "Traceback" not in err
    assert "in flight when interrupted: 4 request(s)" in stdout
    doc = json.loads(out.read_text())
    jsonschema.validate(doc, SCHEMA)
    assert doc["interrupted"] and len(doc["in_flight"]) == 4 and doc["levels"][0]["in_flight"] == 4
    assert doc["levels"][0]["completed"] >= 8


def test_ctrl_c_before_anything_finished_lists_what_was_in_flight(tmp_path: Path) -> None:
    out = tmp_path / "b.json"
    with sim_serve("--time-scale", "1") as sim:  # 256 tokens at ~5 ms a step: over a second each
        proc = bench_proc(sim.url, "-c", "3", "-n", "3", "--input-len", "8", "--output-len", "256",
                          "--out", str(out), "--json")
        wait_for(lambda: sim.counters()["running"] == 3, timeout=30)
        proc.send_signal(signal.SIGINT)
        stdout, err = finish(proc)
    assert proc.returncode == 130, err
    doc = json.loads(stdout)
    assert len(doc["in_flight"]) == 3 and all(r["chunks_received"] >= 0 for r in doc["in_flight"])
    assert json.loads(out.read_text())["in_flight"] == doc["in_flight"]


def test_ctrl_c_during_the_model_probe_ends_at_once(tmp_path: Path) -> None:
    """A server that accepts connections and never answers: the probe would wait 10 s."""
    out = tmp_path / "b.json"
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        proc = bench_proc(url, "-n", "2", "--out", str(out), "--json")
        wait_for(lambda: _accepted(silent), timeout=20)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        stdout, err = finish(proc, timeout=20)
        took = time.monotonic() - t0
    assert proc.returncode == 130, err
    assert took < 3.0, took  # not the probe's 10 s time limit
    doc = json.loads(stdout)
    jsonschema.validate(doc, SCHEMA)
    assert doc["interrupted"] and doc["levels"] == [] and doc["model"] is None
    assert out.is_file()


def _accepted(sock: socket.socket) -> bool:
    sock.settimeout(0.05)
    try:
        conn, _ = sock.accept()
    except TimeoutError:
        return False
    _accepted.conns.append(conn)  # type: ignore[attr-defined]  # kept open: the client waits for an answer
    return True


_accepted.conns = []  # type: ignore[attr-defined]


def test_a_level_stops_early_when_the_server_goes_away() -> None:
    with sim_serve("--time-scale", "20") as sim:
        proc = bench_proc(sim.url, "-c", "2", "-n", "2000", "--input-len", "8", "--output-len", "32", "--json")
        wait_for(lambda: sim.counters()["requests_finished"] >= 6, timeout=30)
        t_kill = time.monotonic()
        os.kill(sim.proc.pid, signal.SIGKILL)
        sim.proc.wait()
        stdout, err = finish(proc)
        ended = time.monotonic() - t_kill
    assert proc.returncode == 7, err
    (lv,) = json.loads(stdout)["levels"]
    assert lv["stopped_early"] and "connection failures in a row" in lv["stopped_early"]
    assert lv["not_sent"] > 1000 and lv["completed"] + lv["failed"] + lv["not_sent"] == 2000
    assert lv["failed"] <= 16  # the ones in flight and 8 connection failures, not the rest of the level
    assert ended < 15
    assert "stopped early" in err and "not sent" in err
