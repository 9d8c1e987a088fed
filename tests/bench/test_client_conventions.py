"""The client's connection convention and its cost-cutting (issue 38), against real HTTP servers.

``--connection pooled`` reuses keep-alive connections (vLLM's ``bench serve``); ``per-request`` opens
one for every request inside its clock (SGLang's ``bench_serving``): a server that records each
request's peer sees it. The load generator's JSON decoders (orjson with the ``fast`` extra, the json
module without) accept and refuse the same events and give the same figures; asyncio's 256 KiB
reads are cut to 64 KiB; uvloop runs the loop where installed, asyncio where not.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import web

from gpuslate.bench import LoadPlan, loadgen, run_bench_async
from gpuslate.bench import client as client_mod
from gpuslate.bench.client import READ_BYTES, StreamParser, small_reads
from gpuslate.bench.metrics import RequestRecord
from gpuslate.bench.prompts import Prompt
from gpuslate.bench.result import BenchResult
from gpuslate.errors import UsageError
from helpers import gpuslate_env
from simproc import sim_serve

pytestmark = pytest.mark.timeout(60)


async def _run_against_recording_server(plan: LoadPlan) -> tuple[BenchResult, list[tuple[str, int]]]:
    """Run ``plan`` against an aiohttp server that streams two tokens a request and records the
    peer (address, port) of every completion request: one port per connection."""
    peers: list[tuple[str, int]] = []

    async def completions(request: web.Request) -> web.StreamResponse:
        peers.append(request.transport.get_extra_info("peername")[:2])  # type: ignore[union-attr]
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i, text in enumerate((" a", " b")):
            doc = {"choices": [{"index": 0, "text": text, "finish_reason": "length" if i else None}]}
            await resp.write(b"data: " + json.dumps(doc).encode() + b"\n\n")
        await resp.write(b'data: {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}}\n\n')
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        result = await run_bench_async(f"http://127.0.0.1:{port}", plan)
    finally:
        await runner.cleanup()
    return result, peers


@pytest.mark.parametrize("fast", [True, False], ids=["http1", "aiohttp"])
@pytest.mark.parametrize("connection", ["pooled", "per-request"])
def test_the_connection_convention_is_what_the_server_sees(connection: str, fast: bool,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_mod, "installed", lambda name: fast if name == "httptools" else True)
    plan = LoadPlan(concurrency=(2,), requests=8, input_len=4, output_len=2, model="m", connection=connection)
    result, peers = asyncio.run(_run_against_recording_server(plan))  # type: ignore[arg-type]
    (lv,) = result.levels
    assert lv.completed == 8 and lv.failed == 0 and lv.output_tokens == 16
    assert len(peers) == 8
    if connection == "pooled":
        assert len(set(peers)) <= 2  # two in flight at a time: two connections, reused
    else:
        assert len(set(peers)) == 8  # a new connection for every request
    doc = result.to_json()
    assert doc["plan"]["connection"] == connection
    assert BenchResult.from_json(doc).plan.connection == connection


def test_a_document_without_a_connection_was_pooled_and_a_bad_one_is_refused() -> None:
    doc = LoadPlan().to_json()
    del doc["connection"]
    assert LoadPlan.from_json(doc).connection == "pooled"
    with pytest.raises(UsageError, match="connection must be one of pooled, per-request"):
        LoadPlan(connection="fresh").validate()  # type: ignore[arg-type]


def test_the_table_says_which_convention_measured_ttft(tmp_path: Any) -> None:
    with sim_serve("--time-scale", "50") as sim:
        for connection, says in (("pooled", "on reused connections (as vLLM's bench serve"),
                                 ("per-request", "a new connection per request (as SGLang's bench_serving)")):
            proc = subprocess.run([sys.executable, "-m", "gpuslate", "bench", sim.url, "-n", "4", "--input-len", "8",
                                   "--output-len", "4", "--connection", connection],
                                  capture_output=True, text=True, env=gpuslate_env(), timeout=60)
            assert proc.returncode == 0, proc.stderr
            assert says in " ".join(proc.stdout.split()), proc.stdout
        bad = subprocess.run([sys.executable, "-m", "gpuslate", "bench", sim.url, "--connection", "fresh"],
                             capture_output=True, text=True, env=gpuslate_env(), timeout=60)
        assert bad.returncode == 2 and "invalid choice: 'fresh'" in bad.stderr


def _stdlib_decoder(monkeypatch: pytest.MonkeyPatch) -> Callable[[bytes], Any]:
    """The json-module decoder the client falls back to without the fast extra."""
    monkeypatch.setitem(sys.modules, "orjson", None)
    name, decode = client_mod._event_decoder()
    assert name == "json"
    return decode


STREAM = [(0.10, b'data: {"choices": [{"index": 0, "text": " a", "finish_reason": null}], '
                 b'"usage": {"prompt_tokens": 3, "completion_tokens": 1}}\n\n'),
          (0.20, b'data: {"choices": [{"index": 0, "text": " b c", "finish_reason": null}], '
                 b'"usage": {"prompt_tokens": 3, "completion_tokens": 3}}\n\ndata: {"choices": [{"index": 0, "te'),
          (0.25, b'xt": "", "finish_reason": "length"}]}\n\n'
                 b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 3}}\n\ndata: [DONE]\n\n')]


def _replay(events: list[tuple[float, bytes]]) -> RequestRecord:
    rec = RequestRecord()
    parser = StreamParser()
    for t, data in events:
        if parser.feed(t, data):
            break
    parser.finish(rec, Prompt(" x y z", 3, 3), None)
    return rec


def test_both_json_decoders_give_the_same_figures_and_refuse_the_same_events(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("orjson")  # the test extra installs it
    fast = _replay(STREAM)
    assert client_mod.JSON_DECODER == "orjson"
    monkeypatch.setattr(client_mod, "decode_event", _stdlib_decoder(monkeypatch))
    slow = _replay(STREAM)
    for rec in (fast, slow):
        assert rec.error is None and rec.output_tokens == 3 and rec.chunk_tokens == [1, 2]
        assert rec.ttft == 0.10 and rec.chunk_times == [0.10, 0.20]
    assert vars(fast) == vars(slow)
    decoders = [client_mod._event_decoder()[1]]
    monkeypatch.delitem(sys.modules, "orjson")
    decoders.append(client_mod._event_decoder()[1])
    for decode in decoders:  # NaN and Infinity are not JSON numbers to either; nor is text that is not UTF-8
        for bad in (b'{"usage": {"completion_tokens": NaN}}', b'{"x": Infinity}', b'{"x": "\xff"}', b"[" * 100_000):
            with pytest.raises(ValueError):
                decode(bad)


@pytest.mark.parametrize("choices", ["5", '{"0": {"text": " a"}}', '["a"]', '[{"text": 5}]',
                                     '[{"delta": "a"}]', '[{"delta": {"content": 7}}]'])
def test_a_chunk_of_the_wrong_shape_is_no_text_and_no_crash(choices: str) -> None:
    events = [(0.1, b'data: {"choices": ' + choices.encode() + b"}\n\n"),
              (0.2, b'data: {"choices": [{"text": " b", "finish_reason": "length"}]}\n\ndata: [DONE]\n\n')]
    rec = _replay(events)
    assert rec.error is None and rec.chunk_times == [0.2] and rec.ttft == 0.2


def test_reads_are_cut_to_64_kib_where_asyncio_would_ask_for_256() -> None:
    class Transport:
        max_size = 256 * 1024

    class Conn:
        transport: Any = Transport()

    class Resp:
        connection: Any = Conn()

    resp: Any = Resp()
    small_reads(resp)
    assert resp.connection.transport.max_size == READ_BYTES == 64 * 1024
    for transport in (object(), None):  # uvloop's and TLS transports have no max_size: left alone
        resp.connection.transport = transport
        small_reads(resp)
    resp.connection = None  # a released response
    small_reads(resp)


def test_without_the_fast_extra_bench_runs_on_asyncio_the_json_module_and_aiohttp(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)
    assert loadgen.event_loop_name() == "asyncio"
    monkeypatch.delitem(sys.modules, "uvloop")
    if pytest.importorskip("uvloop"):
        assert loadgen.event_loop_name() == "uvloop"
    hide = "import sys\nfor m in ('uvloop', 'orjson', 'httptools'):\n    sys.modules[m] = None\n"
    probe = ("from gpuslate.bench import client, loadgen\n"
             "print(client.JSON_DECODER, loadgen.event_loop_name(),\n"
             "      client.streaming_connections('http://h', 'pooled'))\n"
             "from gpuslate.cli.main import main\nsys.exit(main(sys.argv[1:]))\n")
    with sim_serve("--time-scale", "50") as sim:
        proc = subprocess.run([sys.executable, "-c", hide + probe, "bench", sim.url, "-n", "4", "--input-len", "8",
                               "--output-len", "4", "--json"], capture_output=True, text=True, env=gpuslate_env(),
                              timeout=60)
    assert proc.returncode == 0, proc.stderr
    first, doc = proc.stdout.split("\n", 1)
    assert first == "json asyncio None"  # and the streamed requests over aiohttp
    (lv,) = json.loads(doc)["levels"]
    assert lv["completed"] == 4 and lv["output_tokens"] == 16 and lv["failed"] == 0
