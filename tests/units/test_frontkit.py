"""The front tests' and benchmarks/bench_front.py's client (frontkit.StreamLoad) against a real HTTP
server that answers as ``transformers serve`` 5.x does: a body with a field it does not know is 422,
another model than the one it is pinned to 400, and a stream ends with the chunk that says why it
finished, with no ``data: [DONE]`` (its ``cli/serving/completion.py``). Read with ``end="finish"``
those streams are whole; a stream that stops before that chunk is cut; an error event is a failure."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator

import pytest
from aiohttp import web

from frontkit import Req, StreamLoad

pytestmark = pytest.mark.timeout(60)

#: the fields of OpenAI's completion request (openai.types.completion_create_params) and the ones
#: transformers serve adds: any other is 422 there
KNOWN = {"model", "prompt", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n",
         "presence_penalty", "seed", "stop", "stream", "stream_options", "suffix", "temperature", "top_p", "user",
         "generation_config"}
PINNED = "/models/x"


class Server:
    """An aiohttp server in a thread of its own; ``style`` says how its next streams go."""

    def __init__(self) -> None:
        self.style = "transformers"
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if set(body) - KNOWN:
            return web.json_response({"detail": f"Unexpected fields in the request: {set(body) - KNOWN}"}, status=422)
        if body.get("model") != PINNED:
            return web.json_response({"detail": f"Server is pinned to '{PINNED}'"}, status=400)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if self.style == "error":
            await resp.write(b'data: {"error": "CUDA error: out of memory"}\n\n')
            return resp
        await resp.write(b"data: " + json.dumps({"choices": [{"index": 0, "text": " a", "finish_reason": None}]})
                         .encode() + b"\n\n")
        if self.style == "transformers":
            await resp.write(b"data: " + json.dumps({"choices": [{"index": 0, "text": "", "finish_reason": "length"}],
                                                     "usage": {"completion_tokens": 1}}).encode() + b"\n\n")
        return resp  # "cut": it stops before saying why

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        self._runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = self._runner.addresses[0][1]
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())

    def __enter__(self) -> Server:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture
def server() -> Iterator[Server]:
    with Server() as s:
        yield s


def records(server: Server, model: str, end: str = "done") -> list[Req]:
    with StreamLoad(f"http://127.0.0.1:{server.port}", concurrency=2, max_tokens=4, timeout=10, model=model,
                    end=end) as load:
        load.wait_done(4)
        return [r for r in load.stop() if r.end]


def test_streams_without_done_are_whole_when_read_by_their_finish(server: Server) -> None:
    got = records(server, model=PINNED, end="finish")
    assert got and all(r.ok and r.chunks == 2 for r in got), got
    assert all(r.cut and r.error is None for r in records(server, model=PINNED)), "[DONE] is needed by default"


def test_a_stream_stopped_before_its_finish_is_cut_and_an_error_event_fails(server: Server) -> None:
    server.style = "cut"
    assert all(r.cut and r.error is None for r in records(server, model=PINNED, end="finish"))
    server.style = "error"
    got = records(server, model=PINNED, end="finish")
    assert all(not r.cut and r.error and "out of memory" in r.error for r in got), got


def test_the_body_has_only_known_fields_and_the_model_asked(server: Server) -> None:
    got = records(server, model="sim-model", end="finish")
    assert all(r.status == 400 and r.error for r in got), got  # another model: refused, not a 422
    with pytest.raises(ValueError):
        StreamLoad("http://127.0.0.1:1", end="eos")
