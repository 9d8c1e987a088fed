"""The simulated server over real HTTP on 127.0.0.1 (in-process and as a subprocess)."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gpuslate.errors import UsageError
from gpuslate.simserver.perfmodel import PerfParams, throughput
from gpuslate.simserver.server import (
    READY_LINE,
    ServerConfig,
    SimServer,
    add_arguments,
    config_from_args,
    run_server,
    serving,
)
from helpers import gpuslate_env, wait_for

pytestmark = pytest.mark.timeout(60)

SRC = str(Path(__file__).resolve().parents[2] / "src")
# Fast by default: instant startup, steps 1000x faster than modelled.
FAST = ServerConfig(host="127.0.0.1", port=0, startup_seconds=0.0, time_scale=1000.0)


Served = tuple[SimServer, aiohttp.ClientSession, list[str]]


@asynccontextmanager
async def sim(config: ServerConfig = FAST, *, ready: bool = True,
              worker_pids: tuple[int, ...] = ()) -> AsyncIterator[Served]:
    lines: list[str] = []
    async with serving(config, log=lines.append, worker_pids=worker_pids) as server:
        async with aiohttp.ClientSession(base_url=server.url) as http:
            if ready:
                await asyncio.wait_for(server.startup_done.wait(), 10)
            yield server, http, lines


async def until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


def run(coro_fn: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(coro_fn())  # type: ignore[arg-type]


async def sse(resp: aiohttp.ClientResponse) -> list[Any]:
    """Payloads of a server-sent event stream; '[DONE]' stays a string."""
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    events: list[Any] = []
    async for raw in resp.content:
        line = raw.decode().strip()
        if line.startswith("data: "):
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
        else:
            assert line == "", line
    return events


# -- startup and health ------------------------------------------------------


def test_503_while_starting_then_ready() -> None:
    async def go() -> None:
        slow = replace(FAST, startup_seconds=50.0, time_scale=100.0)  # 0.5 s of loading
        async with sim(slow, ready=False) as (server, http, lines):
            for path in ("/health", "/health_generate", "/v1/models"):
                async with http.get(path) as r:
                    assert r.status == 503, path
            async with http.post("/v1/completions", json={"prompt": "hi"}) as r:
                assert r.status == 503
                assert "starting" in (await r.json())["error"]["message"]
            async with http.get("/get_server_info") as r:
                info = await r.json()
                assert info["status"] == "starting" and info["ready_at"] is None
            assert not any(READY_LINE in line for line in lines)

            await asyncio.wait_for(server.startup_done.wait(), 10)
            for path in ("/health", "/health_generate", "/v1/models"):
                async with http.get(path) as r:
                    assert r.status == 200, path
            async with http.get("/v1/models") as r:
                models = await r.json()
            assert models["object"] == "list" and models["data"][0]["id"] == "sim-model"
            assert lines[-1] == f"[sim-serve] {READY_LINE}"
            assert any("loading weights" in line for line in lines)
    run(go)


def test_health_generate_runs_a_real_step() -> None:
    async def go() -> None:
        async with sim() as (server, http, _):
            async with http.get("/health_generate") as r:
                assert r.status == 200
            counters = server.scheduler.counters
            assert counters.steps >= 1 and counters.total_generated_tokens == 1
    run(go)


def test_server_info_reports_config_and_workers() -> None:
    got: dict[str, Any] = {}

    async def go() -> None:
        config = replace(FAST, mode="speculative", spec_disable_threshold=4, model="m-1",
                         perf=PerfParams(accept_length=2.5))
        async with sim(config, worker_pids=(4242, 4343)) as (_, http, _lines):
            async with http.get("/get_server_info") as r:
                got.update(await r.json())
    run(go)
    info = got
    assert info["mode"] == "speculative" and info["spec_disable_threshold"] == 4
    assert info["accept_length"] == 2.5 and info["time_scale"] == 1000.0
    assert info["model"] == "m-1" and info["worker_pids"] == [4242, 4343]
    assert info["status"] == "ready" and info["ready_at"] >= info["started_at"]
    for key in ("running", "waiting", "total_generated_tokens", "steps", "spec_steps", "baseline_steps"):
        assert key in info["counters"]


# -- OpenAI endpoints ----------------------------------------------------------


def test_completion_non_stream_usage_and_max_tokens() -> None:
    async def go() -> None:
        async with sim() as (_, http, _lines):
            body = {"model": "sim-model", "prompt": "x" * 10, "max_tokens": 5, "ignore_eos": True}
            async with http.post("/v1/completions", json=body) as r:
                assert r.status == 200
                out = await r.json()
            assert out["object"] == "text_completion" and out["model"] == "sim-model"
            choice = out["choices"][0]
            assert len(choice["text"].split()) == 5 and choice["finish_reason"] == "length"
            assert out["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
            # Without max_tokens the OpenAI default of 16 applies.
            async with http.post("/v1/completions", json={"prompt": "hi"}) as r:
                assert (await r.json())["usage"]["completion_tokens"] == 16
    run(go)


def test_completion_stream_sends_one_chunk_per_token_group() -> None:
    async def go() -> None:
        # steps of a few milliseconds, longer than the event loop's timer: one chunk a step
        config = replace(FAST, mode="speculative", perf=PerfParams(accept_length=2.5), time_scale=2.0)
        async with sim(config) as (_, http, _lines):
            body = {"prompt": "hello", "max_tokens": 7, "stream": True, "ignore_eos": True}
            async with http.post("/v1/completions", json=body) as r:
                events = await sse(r)
            async with http.post("/v1/completions", json={**body, "stream": False}) as r:
                whole = (await r.json())["choices"][0]["text"]
        assert events[-1] == "[DONE]"
        chunks = events[:-1]
        texts = [c["choices"][0]["text"] for c in chunks]
        # 2.5 accepted tokens per step: 2, 3, then the last 2 -> three token groups (a step that
        # fell due while the loop was behind joins the one before: the counts so far are among 2, 5, 7)
        so_far = list(itertools.accumulate(len(t.split()) for t in texts if t))
        assert so_far[-1] == 7 and set(so_far) <= {2, 5, 7} and len(so_far) >= 2
        assert "".join(texts) == whole
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    run(go)


def test_chat_non_stream_and_stream_with_usage() -> None:
    async def go() -> None:
        async with sim() as (_, http, _lines):
            messages = [{"role": "system", "content": "be brief"},
                        {"role": "user", "content": [{"type": "text", "text": "hello there"}]}]
            body = {"messages": messages, "max_tokens": 6, "ignore_eos": True}
            async with http.post("/v1/chat/completions", json=body) as r:
                out = await r.json()
            stream_body = {**body, "stream": True, "stream_options": {"include_usage": True}}
            async with http.post("/v1/chat/completions", json=stream_body) as r:
                events = await sse(r)
        assert out["object"] == "chat.completion"
        msg = out["choices"][0]["message"]
        assert msg["role"] == "assistant" and len(msg["content"].split()) == 6
        assert out["usage"] == {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}

        assert events[-1] == "[DONE]"
        chunks = events[:-1]
        assert all(c["object"] == "chat.completion.chunk" for c in chunks)
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
        assert content == msg["content"]
        assert chunks[-2]["choices"][0]["finish_reason"] == "length"
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == out["usage"]
    run(go)


def test_sglang_native_generate_stream_and_non_stream() -> None:
    got: dict[str, Any] = {}

    async def go() -> None:
        config = replace(FAST, mode="speculative", perf=PerfParams(accept_length=2.5), time_scale=2.0)  # a chunk a step
        async with sim(config) as (_, http, _lines):
            body = {"text": "hello", "stream": True,
                    "sampling_params": {"max_new_tokens": 7, "ignore_eos": True, "temperature": 0}}
            async with http.post("/generate", json=body) as r:
                got["events"] = await sse(r)
            async with http.post("/generate", json={**body, "stream": False}) as r:
                got["whole"] = await r.json()
            async with http.get("/server_info") as r:  # SGLang's newer name for get_server_info
                got["info"] = await r.json()
    run(go)
    events, whole = got["events"], got["whole"]
    assert events[-1] == "[DONE]"
    metas = [e["meta_info"] for e in events[:-1]]
    # SGLang streams the text so far, with the running completion token count.
    counts = [m["completion_tokens"] for m in metas]  # 2, 5, 7 (a step due while behind joins the last)
    assert counts[-1] == 7 and set(counts) <= {2, 5, 7} and len(counts) >= 2
    assert [m["finish_reason"] for m in metas] == [None] * (len(counts) - 1) + [{"type": "length", "length": 7}]
    assert events[-2]["text"] == whole["text"] and len(whole["text"].split()) == 7
    assert whole["meta_info"]["completion_tokens"] == 7 and whole["meta_info"]["prompt_tokens"] == 2
    # 14 tokens over 6 request-steps (the last step of each request is cut to max_tokens).
    assert got["info"]["internal_states"][0]["avg_spec_accept_length"] == pytest.approx(14 / 6, abs=1e-3)


def test_eos_ends_generation_unless_ignore_eos() -> None:
    async def go() -> None:
        config = replace(FAST, eos_after_tokens=10)
        async with sim(config) as (_, http, _lines):
            chat = {"messages": [{"role": "user", "content": "hi"}]}
            async with http.post("/v1/chat/completions", json=chat) as r:
                natural = await r.json()
            async with http.post("/v1/chat/completions", json={**chat, "max_tokens": 25}) as r:
                capped = await r.json()
            async with http.post("/v1/chat/completions",
                                 json={**chat, "max_tokens": 25, "ignore_eos": True}) as r:
                forced = await r.json()
        assert natural["usage"]["completion_tokens"] == 10
        assert natural["choices"][0]["finish_reason"] == "stop"
        assert capped["usage"]["completion_tokens"] == 10
        assert forced["usage"]["completion_tokens"] == 25
        assert forced["choices"][0]["finish_reason"] == "length"
    run(go)


@pytest.mark.parametrize(("path", "payload"), [
    ("/v1/completions", b"{not json"),
    ("/v1/completions", b"[1, 2]"),
    ("/v1/completions", b"{}"),
    ("/v1/completions", b'{"prompt": "a", "max_tokens": 0}'),
    ("/v1/completions", b'{"prompt": "a", "max_tokens": "5"}'),
    ("/v1/completions", b'{"prompt": "a", "stream": "yes"}'),
    ("/v1/completions", b'{"prompt": ["a", "b"]}'),
    ("/v1/completions", b'{"prompt": "a", "n": 2}'),
    ("/v1/completions", b'{"prompt": "a", "max_tokens": 40000}'),
    ("/v1/chat/completions", b'{"messages": []}'),
    ("/v1/chat/completions", b'{"messages": [{"content": "no role"}]}'),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": 3}]}'),
    ("/generate", b'{"sampling_params": {"max_new_tokens": 4}}'),
    ("/generate", b'{"text": "a", "sampling_params": {"max_new_tokens": -1}}'),
])
def test_malformed_requests_get_openai_style_400(path: str, payload: bytes) -> None:
    async def go() -> None:
        async with sim() as (server, http, _lines):
            async with http.post(path, data=payload,
                                 headers={"Content-Type": "application/json"}) as r:
                assert r.status == 400
                err = (await r.json())["error"]
            assert isinstance(err["message"], str) and err["message"]
            assert err["type"] == "invalid_request_error"
            assert server.scheduler.counters.requests_submitted == 0
    run(go)


def test_client_disconnect_frees_the_batch_slot() -> None:
    async def go() -> None:
        slow = replace(FAST, time_scale=1.0)
        async with sim(slow) as (server, http, _lines):
            body = {"prompt": "a", "max_tokens": 10_000, "stream": True, "ignore_eos": True}
            resp = await http.post("/v1/completions", json=body)
            await resp.content.readline()  # the stream is running
            await until(lambda: server.scheduler.running == 1)
            resp.close()
            await until(lambda: server.scheduler.running == 0)
            assert server.scheduler.counters.requests_aborted == 1
    run(go)


# -- measured throughput through the real server ------------------------------


async def closed_loop(http: aiohttp.ClientSession, concurrency: int, requests_each: int,
                      max_tokens: int) -> float:
    """Output tok/s of ``concurrency`` clients each sending requests back to back."""
    async def client() -> int:
        tokens = 0
        for _ in range(requests_each):
            body = {"prompt": "benchmark", "max_tokens": max_tokens, "ignore_eos": True}
            async with http.post("/v1/completions", json=body) as r:
                tokens += (await r.json())["usage"]["completion_tokens"]
        return tokens

    start = time.perf_counter()
    total = sum(await asyncio.gather(*(client() for _ in range(concurrency))))
    return total / (time.perf_counter() - start)


def measure(mode: str, concurrency: int, time_scale: float, requests_each: int,
            max_tokens: int) -> float:
    result: list[float] = []

    async def go() -> None:
        async with sim(replace(FAST, mode=mode, time_scale=time_scale)) as (_, http, _lines):
            result.append(await closed_loop(http, concurrency, requests_each, max_tokens))
    run(go)
    # Back to modelled tok/s, comparable with the closed form.
    return result[0] / time_scale


@pytest.mark.timing  # measured throughput against the model's: alone, after the parallel part
def test_measured_speculative_wins_at_1_and_loses_at_16() -> None:
    base_1 = measure("baseline", 1, time_scale=5.0, requests_each=3, max_tokens=240)
    spec_1 = measure("speculative", 1, time_scale=5.0, requests_each=3, max_tokens=240)
    # One long request per client: a second round would start with stragglers
    # (HTTP turnaround is not time-scaled) and measure the loop, not the model.
    base_16 = measure("baseline", 16, time_scale=5.0, requests_each=1, max_tokens=100)
    spec_16 = measure("speculative", 16, time_scale=5.0, requests_each=1, max_tokens=100)
    assert spec_1 > base_1 * 1.03, (spec_1, base_1)
    assert spec_16 < base_16 * 0.8, (spec_16, base_16)
    # Real HTTP and event-loop overhead only ever slow the simulator down.
    for got, mode, c in ((base_1, "baseline", 1), (spec_1, "speculative", 1),
                         (base_16, "baseline", 16), (spec_16, "speculative", 16)):
        assert 0.6 * throughput(mode, c) < got < 1.1 * throughput(mode, c), (mode, c, got)


def test_threshold_mode_switches_step_kind_with_load() -> None:
    async def go() -> None:
        config = replace(FAST, mode="speculative", spec_disable_threshold=4, time_scale=50.0)
        async with sim(config) as (server, http, _lines):
            c = server.scheduler.counters
            await closed_loop(http, concurrency=2, requests_each=2, max_tokens=30)
            assert c.spec_steps > 0 and c.baseline_steps == 0
            spec_before = c.spec_steps
            await closed_loop(http, concurrency=16, requests_each=1, max_tokens=40)
            assert c.baseline_steps >= 30  # a batch of 16 > 4: baseline steps
            assert c.spec_steps - spec_before < c.baseline_steps
            async with http.get("/get_server_info") as r:
                counters = (await r.json())["counters"]
            assert counters["spec_steps"] == c.spec_steps
            assert counters["baseline_steps"] == c.baseline_steps
    run(go)


# -- the process: run_server ----------------------------------------------------


def _spawn(config_expr: str) -> subprocess.Popen[str]:
    code = (
        "import sys\n"
        "from gpuslate.simserver.server import ServerConfig, run_server\n"
        f"sys.exit(run_server({config_expr}, start_workers=lambda: [4242]))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True, env=env)


def test_fail_startup_exits_nonzero_with_error_before_ready() -> None:
    proc = _spawn("ServerConfig(port=0, startup_seconds=2.0, time_scale=10.0, fail_startup=True)")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1, err
    assert "Traceback (most recent call last):" in err
    assert "OutOfMemoryError" in err
    assert READY_LINE not in err


def test_sigterm_while_serving_exits_zero_and_closes_the_port() -> None:
    proc = _spawn("ServerConfig(port=0, startup_seconds=0.0)")
    try:
        assert proc.stderr is not None
        url = ""
        for line in proc.stderr:  # pytest-timeout guards a server that never gets ready
            if "listening on " in line:
                url = line.split("listening on ")[1].split()[0]
            if READY_LINE in line:
                break
        host, port = url.removeprefix("http://").rsplit(":", 1)

        async def check() -> None:
            async with aiohttp.ClientSession(base_url=url) as http:
                async with http.get("/health") as r:
                    assert r.status == 200
                async with http.get("/get_server_info") as r:
                    assert (await r.json())["worker_pids"] == [4242]
                # A stream still in flight must not keep the server from exiting.
                body = {"prompt": "a", "max_tokens": 20_000, "stream": True, "ignore_eos": True}
                async with http.post("/v1/completions", json=body) as r:
                    await r.content.readline()
                    proc.send_signal(signal.SIGTERM)
                    rest = await r.content.read()
                assert b"shutting down" in rest
        run(check)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host, int(port)), timeout=2).close()


def test_ctrl_c_of_sim_serve_with_workers_says_it_once_and_exits_130(sim_host) -> None:
    """As a terminal sends it: SIGINT to the whole foreground group, the server and its workers."""
    proc = subprocess.Popen([sys.executable, "-m", "gpuslate", "sim", "serve", "--port", "0", "--gpus", "0-3",
                             "--memory", "1GiB", "--startup-seconds", "0"], stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True, env=gpuslate_env(), start_new_session=True)
    try:
        assert proc.stderr is not None
        before = []
        for line in proc.stderr:
            before.append(line)
            if READY_LINE in line:
                break
        assert any("initializing distributed environment (tp=4," in ln for ln in before), before  # a rank a GPU
        os.killpg(proc.pid, signal.SIGINT)
        rest = proc.stderr.read()
        assert proc.wait(timeout=15) == 130, rest
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert rest.count("received SIGINT, stopping") == 1 and "error" not in rest and "Traceback" not in rest, rest
    wait_for(lambda: not sim_host.held(), timeout=10)  # the workers went with it


def test_port_in_use_is_one_line_exit_2_and_nothing_started(sim_host) -> None:
    """A taken port is bad input: one line, exit 2, and no worker ever held memory (the port is
    taken first)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(UsageError, match="address already in use"):
            run_server(replace(FAST, port=port), start_workers=lambda: pytest.fail("workers started"))
        r = subprocess.run([sys.executable, "-m", "gpuslate", "sim", "serve", "--port", str(port), "--workers", "2"],
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": SRC}, timeout=60)
    assert r.returncode == 2 and r.stderr == (f"gpuslate: error: cannot listen on 127.0.0.1:{port}: address already "
                                              "in use (another server listens there: pick another --port)\n"), r.stderr
    assert not sim_host.held()


# -- flags --------------------------------------------------------------------------


def parse(*argv: str) -> ServerConfig:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return config_from_args(parser.parse_args(list(argv)))


def test_flags_defaults_and_overrides() -> None:
    assert parse() == ServerConfig()
    config = parse("--port", "0", "--mode", "speculative", "--spec-disable-threshold", "8",
                   "--accept-length", "2.5", "--time-scale", "10", "--fail-startup",
                   "--max-running-requests", "32", "--model", "m")
    assert config.mode == "speculative" and config.spec_disable_threshold == 8
    assert config.perf == PerfParams(accept_length=2.5)
    assert config.time_scale == 10.0 and config.fail_startup and config.max_running_requests == 32
    assert config.port == 0 and config.model == "m"


@pytest.mark.parametrize("argv", [
    ("--spec-disable-threshold", "4"),  # needs --mode speculative
    ("--time-scale", "0"),
    ("--port", "70000"),
    ("--accept-length", "0.5"),
    ("--max-running-requests", "0"),
    ("--base-step-ms", "nan"),
])
def test_bad_flags_raise_one_line_value_error(argv: tuple[str, ...]) -> None:
    with pytest.raises(ValueError) as info:
        parse(*argv)
    assert "\n" not in str(info.value)


def test_its_durations_take_units_and_refuse_a_negative_one(capsys) -> None:
    """``--startup-seconds`` and the park times are durations, read by gpuslate's one parser: ``2s``,
    ``500ms`` or seconds; a negative one is argparse's one-line error (exit 2), never a config."""
    config = parse("--startup-seconds", "1m30s", "--sleep-seconds", "500ms", "--wake-seconds", "2")
    assert (config.startup_seconds, config.sleep_seconds, config.wake_seconds) == (90.0, 0.5, 2.0)
    with pytest.raises(SystemExit) as exit_:
        parse("--startup-seconds", "-1")
    assert exit_.value.code == 2
    assert "argument --startup-seconds: invalid duration '-1': must be at least 0" in capsys.readouterr().err
