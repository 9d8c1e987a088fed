"""sim serve's --api-key (as vLLM's) and vLLM's continuous_usage_stats, over real HTTP (issue 17)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuslate.simserver.perfmodel import PerfParams
from test_server import FAST, run, sim, sse

pytestmark = pytest.mark.timeout(60)


def test_api_key_guards_the_v1_routes_only() -> None:
    async def go() -> None:
        async with sim(replace(FAST, api_key="sk-x")) as (_, http, _lines):
            body = {"model": "sim-model", "prompt": "a b", "max_tokens": 2}
            async with http.post("/v1/completions", json=body) as r:
                assert r.status == 401 and (await r.json())["error"]["type"] == "authentication_error"
            async with http.post("/v1/completions", json=body, headers={"Authorization": "Bearer sk-y"}) as r:
                assert r.status == 401
            async with http.get("/v1/models", headers={"Authorization": "Bearer sk-x"}) as r:
                assert r.status == 200
            async with http.post("/v1/completions", json=body, headers={"Authorization": "Bearer sk-x"}) as r:
                assert r.status == 200 and (await r.json())["usage"]["completion_tokens"] == 2
            async with http.get("/health") as r:  # readiness checks need no key
                assert r.status == 200
    run(go)


def test_api_key_must_be_one_line() -> None:
    with pytest.raises(ValueError, match="API key"):
        replace(FAST, api_key="a\nb").validate()


def test_continuous_usage_stats_counts_so_far_on_every_chunk() -> None:
    async def go() -> None:
        config = replace(FAST, mode="speculative", perf=PerfParams(accept_length=3.0), time_scale=2.0)  # a chunk a step
        async with sim(config) as (_, http, _lines):
            body = {"model": "sim-model", "prompt": "a b", "max_tokens": 10, "stream": True, "ignore_eos": True,
                    "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
            async with http.post("/v1/completions", json=body) as r:
                events = await sse(r)
            text_chunks = [e for e in events if isinstance(e, dict) and e.get("choices") and e["choices"][0]["text"]]
            counts = [e["usage"]["completion_tokens"] for e in text_chunks]
            # 3 accepted tokens a step, the last cut to the limit: 3, 6, 9, 10 (a step due while the
            # loop was behind joins the one before)
            assert counts[-1] == 10 and set(counts) <= {3, 6, 9, 10} and len(counts) >= 2
            assert {e["usage"]["prompt_tokens"] for e in text_chunks} == {1}  # "a b": ceil(3 / 4)
            assert events[-2]["usage"]["completion_tokens"] == 10  # the final usage chunk too
    run(go)
