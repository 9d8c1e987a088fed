"""``sim serve --emulate vllm|sglang|trtllm -- ARGS``: the engine's arguments read by the engine's
rules (what it accepts, refuses, or ignores with its own warning), the threshold they come to, the
engine's version where the engine reports it (vLLM's and TensorRT-LLM's /version, SGLang's
/get_server_info) and its owned_by; a patched engine's own flag (``--patched-flag``)."""

from __future__ import annotations

import argparse
import asyncio
import json

import aiohttp
import pytest

from gpuslate.engines.base import threshold_of
from gpuslate.simserver.engineargs import settings
from gpuslate.simserver.server import ServerConfig, add_arguments, config_from_args, serving

SPEC = {"method": "eagle3", "model": "org/d", "num_speculative_tokens": 3}


def vllm(*args: str, version: str | None = "0.25.0", **kw):
    return settings("vllm", ["serve", "org/m", *args], version=version, max_batch=256, read_file=lambda p: "", **kw)


def with_schedule(schedule, **extra) -> str:
    return json.dumps({**SPEC, **extra, "num_speculative_tokens_per_batch_size": schedule})


def test_vllm_arguments():
    s = vllm("--port", "8100", "--host", "0.0.0.0", "--api-key", "k")
    assert s.values == {"port": 8100, "model": "org/m", "host": "0.0.0.0", "api_key": "k"}  # no speculation
    s = vllm("--speculative_config", json.dumps(SPEC), "--served-model-name", "alias")  # --foo_bar is --foo-bar
    assert s.values["mode"] == "speculative" and "spec_disable_threshold" not in s.values
    assert s.values["model"] == "alias" and s.values["port"] == 8000  # vLLM's default port


@pytest.mark.parametrize("schedule, threshold", [
    ([[1, 2, 3], [3, 64, 0]], 2),
    ([[1, 1, 3], [2, 2, 0]], 1),  # the last range's K holds for every larger batch
    ([[1, 8, 3], [16, 32, 0]], 15),  # a gap takes the K before it
    ([[1, 4, 2], [5, 9, 1], [10, 10, 0]], 9),  # any K > 0 is the model's speculative step
    ([[1, 512, 3]], None),
    ([[1, 512, 0]], 0),
])
def test_vllm_schedule_to_threshold(schedule, threshold):
    assert vllm("--speculative-config", with_schedule(schedule)).values.get("spec_disable_threshold") == threshold


@pytest.mark.parametrize("schedule, error", [
    ([], "non-empty"),
    ([[2, 8, 3]], "must start at 1"),
    ([[1, 8, 3], [8, 9, 0]], "non-overlapping"),
    ([[1, 8, -1]], ">= 0"),
    ([[0, 8, 3]], "must be positive"),
    ([[1, 8]], "3-item"),
    ([[1, 4, 1, 64, 3]], "not modelled"),
    ([[1, 2, 0], [3, 9, 3]], "turns it off and on again"),
])
def test_vllm_refuses_what_vllm_refuses(schedule, error):
    with pytest.raises(ValueError, match=error):
        vllm("--speculative-config", with_schedule(schedule))


def test_vllm_config_rules_data_parallel_and_versions():
    with pytest.raises(ValueError, match="greater than zero"):
        vllm("--speculative-config", json.dumps({**SPEC, "num_speculative_tokens": 0}))
    with pytest.raises(ValueError, match="without speculative model"):
        vllm("--speculative-config", json.dumps({"num_speculative_tokens": 2}))
    s = vllm("--speculative-config", with_schedule([[1, 1, 3], [2, 9, 0]]), "-dp", "2")
    assert "spec_disable_threshold" not in s.values and s.values["mode"] == "speculative"  # the static K
    assert "not supported with data parallelism" in s.warnings[0]
    with pytest.raises(ValueError, match="no field 'num_speculative_tokens_per_batch_size'"):
        vllm("--speculative-config", with_schedule([[1, 1, 3]]), version="0.24.1")


def sglang(*args: str, files: dict[str, str] | None = None):
    return settings("sglang", ["--model-path", "org/m", *args], version="0.5.11", max_batch=256,
                    read_file=(files or {}).__getitem__)


BASE = ("--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3")
KEYED = json.dumps({"candidate_steps": [3], "1": {"candidate_steps": [3]}, "5": {"candidate_steps": [0]}})


def test_sglang_adaptive_config_by_batch_size_keys():
    s = sglang(*BASE, "--speculative-adaptive", "--speculative-adaptive-config", "a.json", files={"a.json": KEYED})
    assert s.values["spec_disable_threshold"] == 4 and s.info["speculative_adaptive"] is True
    s = sglang("--speculative-algo", "NEXTN", "--port", "1")  # argparse's abbreviations; NEXTN is EAGLE
    assert s.values == {"port": 1, "model": "org/m", "mode": "speculative"}
    assert s.info["speculative_algorithm"] == "EAGLE"


@pytest.mark.parametrize("extra, reason", [
    (("--speculative-eagle-topk", "4"), "only topk=1"),
    (("--enable-dp-attention",), "attention DP"),
])
def test_sglang_falls_back_to_static_with_one_line(extra, reason):
    s = sglang(*BASE, *extra, "--speculative-adaptive", "--speculative-adaptive-config", "a.json",
               files={"a.json": KEYED})
    assert "spec_disable_threshold" not in s.values and s.info["speculative_adaptive"] is False
    assert s.warnings == (f"speculative_adaptive disabled: {s.warnings[0].split(': ', 1)[1]}",)
    assert reason in s.warnings[0] and "Falling back to static speculative params" in s.warnings[0]


@pytest.mark.parametrize("config, error", [
    ({"candidate_steps": [1, 3]}, "at least one integer-string BS key"),  # the flat form: no keys
    ({"1": {"candidate_steps": []}}, "non-negative ints"),
    ({"1": {"candidate_steps": [-1]}}, "non-negative ints"),
    ({"1": {"candidate_steps": [1, 3, 7]}}, "does not model"),
    ([1], "JSON object"),
])
def test_sglang_loader_rules(config, error):
    with pytest.raises(ValueError, match=error):
        sglang(*BASE, "--speculative-adaptive", "--speculative-adaptive-config", "a.json",
               files={"a.json": json.dumps(config)})


def test_threshold_shapes():
    assert threshold_of(lambda b: 3 if b <= 7 else 0, 64) == 7
    assert threshold_of(lambda b: 3, 64) is None
    with pytest.raises(ValueError):
        threshold_of(lambda b: 0 if b < 4 else 3, 64)


def parse(*argv: str) -> ServerConfig:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return config_from_args(p.parse_args(list(argv)))


def test_the_cli_takes_the_engines_arguments_after_a_double_dash():
    c = parse("--emulate", "vllm", "--engine-version", "0.25.0", "--time-scale", "5", "--",
              "serve", "m", "--port", "9", "--speculative-config", with_schedule([[1, 2, 3], [3, 9, 0]]))
    assert (c.port, c.model, c.mode, c.spec_disable_threshold, c.time_scale) == (9, "m", "speculative", 2, 5.0)
    with pytest.raises(ValueError, match="the engine's arguments set port: leave out the simulator's flags"):
        parse("--emulate", "vllm", "--port", "1", "--", "serve", "m")
    with pytest.raises(ValueError, match="need --emulate"):
        parse("--", "serve", "m")


def trtllm(*args: str, options: dict | str | None = None, version: str | None = "1.3.0"):
    import yaml

    text = options if isinstance(options, str) else yaml.safe_dump(options or {})
    return settings("trtllm", ["/m/target", *args], version=version, max_batch=256,
                    read_file={"o.yaml": text}.__getitem__)


EAGLE3 = {"decoding_type": "Eagle3", "max_draft_len": 3, "speculative_model": "/m/d"}


def test_trtllm_arguments_and_its_options_file():
    s = trtllm("--port", "8100", "--max_batch_size", "32")
    assert s.values == {"port": 8100, "model": "/m/target", "host": "localhost", "max_running_requests": 32}
    s = trtllm("--config", "o.yaml", options={"speculative_config": EAGLE3})  # --config: its other name
    assert s.values["mode"] == "speculative" and "spec_disable_threshold" not in s.values
    # the schedule as TensorRT-LLM reads it since PR #10860: the first key not below the batch, 0 above all
    s = trtllm("--extra_llm_api_options", "o.yaml",
               options={"speculative_config": {**EAGLE3, "draft_len_schedule": {1: 3, 4: 3, 5: 0}}})
    assert s.values["spec_disable_threshold"] == 4
    s = trtllm("--extra_llm_api_options", "o.yaml", options={"speculative_config": {**EAGLE3, "max_concurrency": 2}})
    assert s.values["spec_disable_threshold"] == 2  # translated into {2: max_draft_len}
    s = trtllm("--extra_llm_api_options", "o.yaml", "--backend", "tensorrt",
               options={"speculative_config": {**EAGLE3, "max_concurrency": 2}})
    assert "spec_disable_threshold" not in s.values and "PyTorch backend only" in s.warnings[0]


@pytest.mark.parametrize("spec, error", [
    ({**EAGLE3, "max_concurrency": 2, "draft_len_schedule": {1: 3}}, "mutually exclusive"),
    ({**EAGLE3, "draft_len_schedule": {1: 2, 4: 0}}, "must equal max_draft_len"),
    ({**EAGLE3, "draft_len_schedule": {1: 3, 4: 5}}, "must be <= max_draft_len"),
    ({**EAGLE3, "draft_len_schedule": {0: 3}}, "must be >= 1"),
    ({**EAGLE3, "draft_len_schedule": {1: 3, 2: -1}}, "must be >= 0"),
    ({"max_draft_len": 3}, "decoding_type is required"),
    ({**EAGLE3, "draft_len_schedule": {1: 3, 2: 0, 3: 3}}, "turns it off and on again"),
])
def test_trtllm_refuses_what_it_refuses(spec, error):
    with pytest.raises(ValueError, match=error):
        trtllm("--extra_llm_api_options", "o.yaml", options={"speculative_config": spec})
    with pytest.raises(ValueError, match="anchors or aliases"):
        trtllm("--extra_llm_api_options", "o.yaml", options="a: &x 1\nb: *x\n")
    with pytest.raises(ValueError, match="No such option: --extra_llm"):
        trtllm("--extra_llm", "o.yaml")  # click takes no abbreviations


def test_a_patched_engine_takes_its_own_flag():
    flag = "speculative-disable-batch-threshold"
    s = settings("sglang", ["--model-path", "m", *BASE, f"--{flag}", "2"], version=None, max_batch=256,
                 read_file=lambda p: "", patched_flag=flag)
    assert s.values["spec_disable_threshold"] == 2 and s.info["patched_flag"] == f"--{flag}"
    s = settings("sglang", ["--model-path", "m", *BASE, "--speculative-disable", "3"], version=None, max_batch=256,
                 read_file=lambda p: "", patched_flag=flag)  # SGLang's argparse: the patched flag abbreviated
    assert s.values["spec_disable_threshold"] == 3
    with pytest.raises(ValueError, match="need --emulate"):
        parse("--patched-flag", flag)


def test_the_emulated_engines_report_their_version_where_the_engines_do():
    import yaml

    options = {"o.yaml": yaml.safe_dump({"speculative_config": EAGLE3})}

    async def go() -> None:
        for engine, argv in (("vllm", ["serve", "m", "--speculative-config", json.dumps(SPEC)]),
                             ("sglang", ["--model-path", "m", *BASE]),
                             ("trtllm", ["/m", "--extra_llm_api_options", "o.yaml"])):
            s = settings(engine, argv, version="9.9.9", max_batch=256, read_file=options.__getitem__)
            config = ServerConfig(port=0, startup_seconds=0, time_scale=1000.0, emulate=engine,
                                  engine_version="9.9.9", engine_info=s.info,
                                  **{k: v for k, v in s.values.items() if k != "port"})
            async with serving(config, log=lambda line: None) as server, aiohttp.ClientSession() as http:
                async with http.get(server.url + "/version") as r:
                    assert r.status == (404 if engine == "sglang" else 200)
                    if engine != "sglang":
                        assert await r.json() == {"version": "9.9.9"}
                async with http.get(server.url + "/v1/models") as r:  # what tells vLLM from TensorRT-LLM
                    owned = (await r.json())["data"][0]["owned_by"]
                    assert owned == {"vllm": "vllm", "sglang": "sglang", "trtllm": "tensorrt_llm"}[engine]
                async with http.get(server.url + "/get_server_info") as r:
                    info = await r.json()
                assert info["simulated"] and info["emulates"] == engine and info["engine_version"] == "9.9.9"
                if engine == "sglang":
                    assert info["version"] == "9.9.9" and info["speculative_num_steps"] == 3
                    assert info["speculative_algorithm"] == "EAGLE3"

    asyncio.run(go())
