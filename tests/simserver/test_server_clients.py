"""The simulated server as real OpenAI clients see it: every error an OpenAI-shaped JSON body,
models.retrieve, unknown models, servers without streamed usage."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import aiohttp
import pytest

from gpuslate.simserver.server import ServerConfig, SimServer, add_arguments, config_from_args, serving

pytestmark = pytest.mark.timeout(60)

FAST = ServerConfig(host="127.0.0.1", port=0, startup_seconds=0.0, time_scale=1000.0)


@asynccontextmanager
async def sim(config: ServerConfig = FAST) -> AsyncIterator[tuple[SimServer, aiohttp.ClientSession]]:
    async with serving(config, log=lambda line: None) as server:
        async with aiohttp.ClientSession(base_url=server.url) as http:
            await asyncio.wait_for(server.startup_done.wait(), 10)
            yield server, http


def assert_openai_error(doc: Any, code: int | str) -> dict[str, Any]:
    assert set(doc) == {"error"}
    err = doc["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str)
    assert err["code"] == code
    return err


def test_routing_errors_are_openai_json() -> None:
    async def go() -> None:
        async with sim(replace(FAST, max_body_bytes=4096)) as (_, http):
            async with http.get("/v1/nothing") as r:
                assert r.status == 404 and r.content_type == "application/json"
                err = assert_openai_error(await r.json(), 404)
                assert err["message"] == "Not Found: GET /v1/nothing"
            async with http.get("/v1/completions") as r:
                assert r.status == 405 and "POST" in r.headers["Allow"]
                assert_openai_error(await r.json(), 405)
            async with http.post("/v1/completions", data=b"x" * 10_000,
                                 headers={"Content-Type": "application/json"}) as r:
                assert r.status == 413
                err = assert_openai_error(await r.json(), 413)
                assert "4096 bytes" in err["message"]
            async with http.post("/v1/completions", data=b"{not json") as r:
                assert r.status == 400
                assert_openai_error(await r.json(), 400)
    asyncio.run(go())


def test_models_retrieve_and_unknown_models() -> None:
    async def go() -> None:
        async with sim(replace(FAST, model="org/m-1")) as (server, http):
            async with http.get("/v1/models/org/m-1") as r:
                assert r.status == 404  # an id with a slash is not one path segment...
            async with http.get("/v1/models/org%2Fm-1") as r:
                assert r.status == 200  # ...unless encoded, as the OpenAI SDK does
                card = await r.json()
                assert card["id"] == "org/m-1" and card["object"] == "model"
            async with http.get("/v1/models/gpt-4") as r:
                assert r.status == 404
                err = assert_openai_error(await r.json(), "model_not_found")
                assert err["message"] == "The model `gpt-4` does not exist." and err["param"] == "model"
            for path, body in (("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
                               ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                         "max_tokens": 2})):
                async with http.post(path, json={**body, "model": "gpt-4"}) as r:
                    assert r.status == 404
                    assert_openai_error(await r.json(), "model_not_found")
                async with http.post(path, json={**body, "model": "org/m-1"}) as r:
                    assert r.status == 200
                async with http.post(path, json=body) as r:  # no model: the served one
                    assert r.status == 200 and (await r.json())["model"] == "org/m-1"
                async with http.post(path, json={**body, "model": 5}) as r:
                    assert r.status == 400
                    assert assert_openai_error(await r.json(), 400)["param"] == "model"
            # SGLang's native API names no model
            async with http.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}}) as r:
                assert r.status == 200
            # the 404s never reached the scheduler
            assert server.scheduler.counters.requests_submitted == 5
    asyncio.run(go())


def test_no_stream_usage_ignores_include_usage() -> None:
    async def events(http: aiohttp.ClientSession, path: str, body: dict[str, Any]) -> list[str]:
        async with http.post(path, json=body) as r:
            assert r.status == 200
            return [x for x in (await r.text()).split("\n\n") if x]

    async def go() -> None:
        body = {"prompt": "hi", "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}
        async with sim() as (_, http):
            with_usage = await events(http, "/v1/completions", body)
        async with sim(replace(FAST, stream_usage=False)) as (_, http):
            without = await events(http, "/v1/completions", body)
            async with http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3}) as r:
                assert (await r.json())["usage"]["completion_tokens"] == 3  # whole responses keep it
        assert any('"completion_tokens":3' in e for e in with_usage)
        assert not any("usage" in e for e in without)
        # the usage comes alone, last before [DONE], and only when asked for (how many tokens share a chunk
        # depends on the machine's load, so the two streams' lengths are not compared)
        usage_only = [e for e in with_usage if '"choices":[]' in e]
        assert len(usage_only) == 1 and with_usage[-2] == usage_only[0] and with_usage[-1] == "data: [DONE]"
        assert without[-1] == "data: [DONE]" and not any('"choices":[]' in e for e in without)
    asyncio.run(go())


def test_no_stream_usage_flag() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert config_from_args(parser.parse_args(["--no-stream-usage"])).stream_usage is False
    assert config_from_args(parser.parse_args([])).stream_usage is True


def test_spec_counters_are_reported_raw() -> None:
    async def go() -> None:
        async with sim(replace(FAST, mode="speculative")) as (_, http):
            async with http.post("/v1/completions", json={"prompt": "x", "max_tokens": 7, "ignore_eos": True}) as r:
                assert r.status == 200
            async with http.get("/get_server_info") as r:
                counters = (await r.json())["counters"]
        # 7 tokens at 3 per step: 3 + 3 + 1 over 3 verifications
        assert counters["spec_tokens"] == 7 and counters["spec_request_steps"] == 3
        assert counters["avg_spec_accept_length"] == round(7 / 3, 4)
    asyncio.run(go())
