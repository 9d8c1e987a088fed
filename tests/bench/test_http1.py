"""The streamed request's own HTTP/1.1 connections (gpuslate.bench.http1, with the fast extra's httptools),
against raw servers that answer well, badly, late or not at all.

Each case runs a real ``run_bench_async`` against an ``asyncio.start_server`` speaking bytes chosen by
the test, once over :mod:`gpuslate.bench.http1` and once over aiohttp (httptools hidden): the records
must agree, every failure must be one line grouped in the level's errors (the server's absence
counted as a connection failure), and nothing may hang past the plan's timeout.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

pytest.importorskip("httptools")

from gpuslate.bench import LoadPlan, run_bench_async
from gpuslate.bench import client as client_mod
from gpuslate.bench.client import is_connection_failure
from gpuslate.bench.http1 import MAX_HEAD_BYTES
from gpuslate.bench.metrics import RequestRecord
from gpuslate.bench.result import BenchResult

pytestmark = pytest.mark.timeout(60)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


def sse(doc: Any) -> bytes:
    body = b"data: " + (doc if isinstance(doc, bytes) else json.dumps(doc).encode()) + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(body), body)


def tokens(n: int) -> bytes:
    out = b"".join(sse({"choices": [{"index": 0, "text": f" w{i}", "finish_reason": "length" if i == n - 1 else None}],
                        "usage": {"prompt_tokens": 4, "completion_tokens": i + 1}}) for i in range(n))
    return out + sse({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": n}}) + sse(b"[DONE]")


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


#: the connections that carried a completion request (the probes' GETs go over aiohttp's own): their
#: writers themselves, held, not their id()s, which a closed connection's freed writer passes on to the next
POSTING: set[asyncio.StreamWriter] = set()


async def read_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """Read up to the next POST and its body (a GET, the model probe's or the server facts', gets a 404
    on the same connection); False at EOF."""
    while True:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False
        lines = head.split(b"\r\n")
        if not lines[0].startswith(b"POST"):
            writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            continue
        length = next(int(line.split(b":")[1]) for line in lines if line.lower().startswith(b"content-length"))
        await reader.readexactly(length)
        POSTING.add(writer)
        return True


async def run(handler: Handler, *, fast: bool, monkeypatch: pytest.MonkeyPatch, **plan: Any) -> tuple[BenchResult, int]:
    """Run a plan against a server whose connections ``handler`` serves; (result, connections that
    carried completion requests)."""
    monkeypatch.setattr(client_mod, "installed", lambda name: fast if name == "httptools" else True)
    accepted = 0
    POSTING.clear()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        try:
            await handler(reader, writer, accepted)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client went, or the test is over
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        result = await run_bench_async(f"http://127.0.0.1:{port}", LoadPlan(
            **{"concurrency": (1,), "requests": 3, "input_len": 4, "output_len": 3, "model": "m", **plan}))
    finally:
        server.close()
    return result, len(POSTING)


def both(handler: Handler, monkeypatch: pytest.MonkeyPatch, **plan: Any) -> list[tuple[BenchResult, int]]:
    return [asyncio.run(run(handler, fast=fast, monkeypatch=monkeypatch, **plan)) for fast in (True, False)]


async def well(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
    """Keep-alive: every request on the connection answered with 3 tokens, then the chunked body's end."""
    while await read_request(reader, writer):
        writer.write(HEAD + tokens(3) + b"0\r\n\r\n")
        await writer.drain()


async def late_end(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
    """[DONE] first; the chunked body's end 10 ms later, in a write of its own."""
    while await read_request(reader, writer):
        writer.write(HEAD + tokens(3))
        await writer.drain()
        await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")
        await writer.drain()


def test_both_transports_record_the_same_and_pool_the_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    (fast, fast_conns), (slow, slow_conns) = both(well, monkeypatch, requests=4)
    for result in (fast, slow):
        (lv,) = result.levels
        assert lv.completed == 4 and lv.failed == 0 and lv.output_tokens == 12 and lv.input_tokens == 16
        assert lv.tokens_per_chunk == 1.0
    assert fast_conns == slow_conns == 1


def test_a_connection_whose_answer_ends_after_done_rejoins_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """The request is over at [DONE] (its E2E stamped there); the connection waits for the message's last
    chunk, then serves the next request: arrivals 50 ms apart, the end 10 ms after [DONE]."""
    result, conns = asyncio.run(run(late_end, fast=True, monkeypatch=monkeypatch, requests=4, request_rate=20.0,
                                    burstiness=1000.0, max_concurrency=1))
    (lv,) = result.levels
    assert lv.completed == 4 and lv.e2e_ms.max is not None and lv.e2e_ms.max < 10.0
    assert conns == 1


def test_per_request_connections_go_over_aiohttp_as_sglangs_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_mod, "installed", lambda name: True)
    assert client_mod.streaming_connections("http://h:1", "pooled") is not None
    assert client_mod.streaming_connections("http://h:1", "per-request") is None
    for result, conns in both(well, monkeypatch, requests=4, connection="per-request"):
        assert result.levels[0].completed == 4 and conns == 4


async def cut_mid_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
    await read_request(reader, writer)
    writer.write(HEAD + tokens(3)[:60])  # the stream stops inside its first event: the server is gone


async def close_at_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
    await read_request(reader, writer)


async def huge_head(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
    await read_request(reader, writer)
    writer.write(b"HTTP/1.1 200 OK\r\n" + b"X-Filler: " + b"a" * (MAX_HEAD_BYTES + 10) + b"\r\n\r\n")
    await writer.drain()
    await asyncio.sleep(5)


async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
    await read_request(reader, writer)
    writer.write(b"SPDY/9 banana\r\n\r\n")
    await writer.drain()
    await asyncio.sleep(5)


async def error_500(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
    while await read_request(reader, writer):
        body = json.dumps({"error": {"message": "model overloaded " + "x" * 200_000}}).encode()
        writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()


async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
    await read_request(reader, writer)
    await asyncio.sleep(30)


@pytest.mark.parametrize(("handler", "message", "gone"), [
    (cut_mid_stream, "response cut short", True),
    (close_at_once, "server disconnected", True),
    (huge_head, "malformed response", False),
    (garbage, "malformed response", False),
    (error_500, "HTTP 500: ", False),
])
def test_a_bad_answer_fails_its_request_in_one_line(handler: Handler, message: str, gone: bool,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    result, _ = asyncio.run(run(handler, fast=True, monkeypatch=monkeypatch, requests=2))
    (lv,) = result.levels
    assert lv.completed == 0 and lv.failed == 2, lv.errors
    (error,) = lv.errors
    assert error.startswith(message) and "\n" not in error and len(error) <= 200, error
    assert is_connection_failure(RequestRecord(error=error)) is gone
    if handler is huge_head:
        assert f"headers of more than {MAX_HEAD_BYTES} bytes" in error
    if handler is error_500:  # 64 KiB of its 200 KB read: the message is there, cut to a line
        assert "model overloaded" in error


def test_a_server_that_never_answers_times_out_on_time(monkeypatch: pytest.MonkeyPatch) -> None:
    t0 = time.monotonic()
    result, _ = asyncio.run(run(silent, fast=True, monkeypatch=monkeypatch, requests=1, timeout_s=0.5))
    assert time.monotonic() - t0 < 10
    assert result.levels[0].errors == {"timeout after 0.5 s": 1}


def test_cancelled_requests_abort_their_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stop mid-stream ends the run at once and the server sees its connection go (EOF)."""
    saw_eof = asyncio.Event()

    async def slow_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader, writer)
        writer.write(HEAD + tokens(1)[:40])
        await writer.drain()
        await reader.read()  # until the client goes
        saw_eof.set()

    async def go() -> BenchResult:
        monkeypatch.setattr(client_mod, "installed", lambda name: True)
        server = await asyncio.start_server(slow_stream, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.3, stop.set)
        try:
            result = await run_bench_async(f"http://127.0.0.1:{port}", LoadPlan(
                concurrency=(2,), requests=2, input_len=4, output_len=3, model="m"), stop=stop)
            await asyncio.wait_for(saw_eof.wait(), 5)
        finally:
            server.close()
        return result

    result = asyncio.run(go())
    assert result.interrupted and len(result.in_flight) == 2
