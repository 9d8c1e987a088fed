"""Every file gpuslate can write, held against the engines' own rules (engine_facts.py, transcribed
from their sources), with hypothesis over the recommendation's inputs: the vLLM config is one
vLLM accepts and its lookup speculates with the measured K exactly up to the threshold; the SGLang
config is one the keyed loader accepts, whose slots run the measured step count up to the
threshold and 0 above, and which the flat loader before it refuses (never ignores); the TensorRT-LLM
options file passes both of its validators and reads as "the measured draft length up to the
threshold, 0 above" under both key rules it has had, every other key kept; the simulator playing
each engine reads the command line written as that threshold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from engine_facts import (
    sglang_flat_loader,
    sglang_initial_steps,
    sglang_keyed_slots,
    sglang_route,
    trtllm_check_config,
    trtllm_lookup,
    trtllm_validate,
    vllm_check_config,
    vllm_lookup,
)
from gpuslate.bench.threshold import recommend
from gpuslate.engines import COMMAND_FILE, ApplyStatus, plan_apply, read_command
from gpuslate.engines.sglang import CONFIG_FILE as SGLANG_CONFIG_FILE
from gpuslate.engines.trtllm import OPTIONS_FILE as TRTLLM_OPTIONS_FILE
from gpuslate.engines.vllm import CONFIG_FILE as VLLM_CONFIG_FILE
from gpuslate.simserver.engineargs import settings as sim_settings

LEVELS = st.lists(st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128, 256, 512]), min_size=2, max_size=7,
                  unique=True).map(sorted)
K = st.integers(1, 16)
METHOD = st.sampled_from([{"method": "eagle3", "model": "org/eagle3"}, {"method": "eagle", "model": "org/e"},
                          {"model": "org/draft-model"}, {"method": "ngram", "prompt_lookup_max": 4},
                          {"method": "mtp"}])


def vllm_argv(k: int, extra: dict) -> list[str]:
    return ["vllm", "serve", "org/model", "--port", "8000",
            "--speculative-config", json.dumps({**extra, "num_speculative_tokens": k})]


def sglang_argv(steps: int) -> list[str]:
    return ["python3", "-m", "sglang.launch_server", "--model-path", "org/model", "--speculative-algorithm", "EAGLE3",
            "--speculative-num-steps", str(steps), "--speculative-eagle-topk", "1", "--port", "30000"]


#: other keys of a TensorRT-LLM options file, kept as they were (top level and in speculative_config)
TRT_EXTRA = st.fixed_dictionaries({}, optional={
    "kv_cache_config": st.fixed_dictionaries({"free_gpu_memory_fraction": st.sampled_from([0.5, 0.85])}),
    "enable_chunked_prefill": st.booleans(), "cuda_graph_config": st.just({"max_batch_size": 64}),
    "max_batch_size": st.integers(1, 1024)})
TRT_SPEC = st.fixed_dictionaries({"decoding_type": st.sampled_from(["Eagle3", "Eagle", "MTP", "NGram"])}, optional={
    "speculative_model": st.just("/m/eagle3"), "eagle3_one_model": st.booleans(), "max_concurrency": st.integers(1, 8),
    "max_matching_ngram_size": st.just(3)})


def trtllm_argv(path: str = "opts.yaml", flag: str = "--extra_llm_api_options") -> list[str]:
    return ["trtllm-serve", "/m/target", "--tp_size", "8", "--port", "8000", flag, path]


def check_trtllm(plan, k: int, doc: dict, threshold: int, top: int) -> None:
    written = yaml.safe_load(plan.files[TRTLLM_OPTIONS_FILE])  # the parser trtllm-serve reads it with
    spec = written["speculative_config"]
    trtllm_check_config(spec)  # max_concurrency dropped: the two are mutually exclusive
    sched = trtllm_validate(spec["draft_len_schedule"], spec["max_draft_len"])
    assert spec["max_draft_len"] == k
    for rule in ("upper", "lower"):
        for batch in range(1, top + 3):
            assert trtllm_lookup(sched, batch, rule) == (k if batch <= threshold else 0), (rule, batch, sched)
    kept = {**doc, "speculative_config": {x: v for x, v in doc["speculative_config"].items() if x != "max_concurrency"}}
    assert {**written, "speculative_config": {x: v for x, v in spec.items() if x != "draft_len_schedule"}} == kept
    argv = list(plan.command)
    assert argv[-1].endswith(TRTLLM_OPTIONS_FILE) and argv[:-1] == trtllm_argv()[:-1]


def check_vllm(plan, k: int, extra: dict, threshold: int, top: int) -> None:
    cfg = json.loads(plan.files[VLLM_CONFIG_FILE])
    vllm_check_config(cfg)  # vLLM accepts it
    assert {key: v for key, v in cfg.items() if key != "num_speculative_tokens_per_batch_size"} == \
        {**extra, "num_speculative_tokens": k}  # method, model, K and the rest kept as measured
    for max_batch in (1, threshold, threshold + 1, top, 2 * top + 7):
        dense = vllm_lookup(cfg["num_speculative_tokens_per_batch_size"], max_batch, k)
        assert all(dense[b] == (k if b <= threshold else 0) for b in range(1, max_batch + 1))
    argv = json.loads(json.dumps(plan.command))
    assert argv[argv.index("--speculative-config") + 1] == json.dumps(cfg, separators=(",", ":"))
    assert plan.files[COMMAND_FILE].count("\n") == 1  # one command line


def check_sglang(plan, steps: int, threshold: int, top: int, tmp: Path) -> None:
    cfg = json.loads(plan.files[SGLANG_CONFIG_FILE])
    slots = sglang_keyed_slots(cfg)  # SGLang's keyed loader accepts it
    for batch in range(1, 2 * top + 8):
        candidates = slots[sglang_route(slots, batch)]
        assert candidates == ([steps] if batch <= threshold else [0])  # one candidate: fixed, never adaptive
        assert sglang_initial_steps(candidates, steps) == candidates[0]
    for add_initial in (False, True):  # the loader before the keys refuses it, loudly
        with pytest.raises(AssertionError):
            sglang_flat_loader(cfg, steps, add_initial=add_initial)
    argv = list(plan.command)
    assert argv[argv.index("--speculative-adaptive-config") + 1].endswith(SGLANG_CONFIG_FILE)
    assert "--speculative-adaptive" in argv and argv[argv.index("--speculative-num-steps") + 1] == str(steps)


@settings(max_examples=200, deadline=None)
@given(K, METHOD, st.integers(1, 4096), st.integers(1, 8192))
def test_vllm_schedule_conforms(k, extra, threshold, top):
    assume(top >= threshold)
    plan = plan_apply(read_command(vllm_argv(k, extra)), threshold, top=top, out_dir="/x", version="0.25.0")
    assert plan.status is ApplyStatus.READY
    check_vllm(plan, k, extra, threshold, min(top, 600))


@settings(max_examples=200, deadline=None)
@given(K, st.integers(1, 300), st.integers(1, 600))
def test_sglang_config_conforms(steps, threshold, top):
    assume(top >= threshold)
    plan = plan_apply(read_command(sglang_argv(steps)), threshold, top=top, out_dir="/runs/r", version="0.5.11")
    assert plan.status is ApplyStatus.READY
    check_sglang(plan, steps, threshold, top, Path("/runs/r"))


@settings(max_examples=200, deadline=None)
@given(K, st.integers(1, 300), st.integers(1, 600), TRT_EXTRA, TRT_SPEC)
def test_trtllm_options_file_conforms(k, threshold, top, extra, spec):
    assume(top >= threshold)
    doc = {**extra, "speculative_config": {**spec, "max_draft_len": k}}
    files = {"opts.yaml": yaml.safe_dump(doc)}
    plan = plan_apply(read_command(trtllm_argv(), read_file=files.__getitem__), threshold, top=top, out_dir="/runs/r",
                      version="1.3.0")
    assert plan.status is ApplyStatus.READY, (plan.missing, plan.blockers)
    check_trtllm(plan, k, doc, threshold, min(top, 300))


def test_sglang_cuda_graph_padding_moves_the_switch_off_uncaptured_thresholds():
    """A fact the report names: with CUDA graphs a batch is padded first, so with T = 3 and sizes
    [1, 2, 4, 8] a batch of 3 (padded to 4) runs 0 steps; with a captured T it is exact."""
    plan = plan_apply(read_command(sglang_argv(3)), 3, top=8, out_dir="/x", version=None)
    slots = sglang_keyed_slots(json.loads(plan.files[SGLANG_CONFIG_FILE]))
    assert slots[sglang_route(slots, 3, [1, 2, 4, 8])] == [0]
    plan = plan_apply(read_command(sglang_argv(3)), 4, top=8, out_dir="/x", version=None)
    slots = sglang_keyed_slots(json.loads(plan.files[SGLANG_CONFIG_FILE]))
    assert [slots[sglang_route(slots, b, [1, 2, 4, 8])] for b in range(1, 9)] == [[3]] * 4 + [[0]] * 4
    assert any("captured" in u for u in plan.unproven)


value = st.floats(min_value=1.0, max_value=1e4, allow_nan=False)


@st.composite
def experiments(draw):
    levels = draw(LEVELS)
    repeats = draw(st.integers(1, 3))
    return ({c: draw(st.lists(value, min_size=repeats, max_size=repeats)) for c in levels},
            {c: draw(st.lists(value, min_size=repeats, max_size=repeats)) for c in levels})


@settings(max_examples=300, deadline=None)
@given(experiments(), K, METHOD, st.booleans(), st.data())
def test_every_recommendation_writes_conforming_files(exp, k, extra, drift_measured, data):
    """Over the recommendation's inputs: whatever it decides, a threshold it recommends is written
    in each engine's form so that the engine speculates exactly up to it; one it does not
    recommend is never written (no files: the report's rule)."""
    base, spec = exp
    if data.draw(st.booleans()):  # a clear crossover at a drawn level, measured well enough to recommend
        t = data.draw(st.sampled_from(sorted(base)))
        base = {c: [vs[0] * (1 + 0.01 * i) for i in range(max(2, len(vs)))] for c, vs in base.items()}
        spec = {c: [v * (3.0 if c <= t else 0.2) for v in base[c]] for c in base}
        drift_measured = True
    rec = recommend(base, spec, num_speculative_tokens=k, drift_measured=drift_measured)
    if rec.decision != "disable_above" or not rec.recommended:
        return
    assert rec.threshold is not None and rec.threshold in base
    vllm = plan_apply(read_command(vllm_argv(k, extra)), rec.threshold, top=rec.largest_level, out_dir="/o",
                      version="0.25.0")
    check_vllm(vllm, k, extra, rec.threshold, rec.largest_level)
    sgl = plan_apply(read_command(sglang_argv(k)), rec.threshold, top=rec.largest_level, out_dir="/o", version=None)
    check_sglang(sgl, k, rec.threshold, rec.largest_level, Path("/o"))
    doc = {"speculative_config": {"decoding_type": "Eagle3", "max_draft_len": k, "speculative_model": "/m/d"}}
    trt = plan_apply(read_command(trtllm_argv(), read_file={"opts.yaml": yaml.safe_dump(doc)}.__getitem__),
                     rec.threshold, top=rec.largest_level, out_dir="/o", version=None)
    check_trtllm(trt, k, doc, rec.threshold, rec.largest_level)
    # the reference forms in the document agree with the files
    forms = rec.engine_forms()
    assert forms["vllm_speculative_config"]["num_speculative_tokens_per_batch_size"] == \
        json.loads(vllm.files[VLLM_CONFIG_FILE])["num_speculative_tokens_per_batch_size"]
    assert {int(b): v for b, v in forms["trtllm_speculative_config"]["draft_len_schedule"].items()} == \
        yaml.safe_load(trt.files[TRTLLM_OPTIONS_FILE])["speculative_config"]["draft_len_schedule"]


@settings(max_examples=100, deadline=None)
@given(K, st.integers(1, 200))
def test_the_simulator_playing_the_engine_reads_the_written_command_as_the_threshold(k, threshold):
    vllm = plan_apply(read_command(vllm_argv(k, {"method": "eagle3", "model": "d"})), threshold, top=256,
                      out_dir="/o", version="0.25.0")
    got = sim_settings("vllm", list(vllm.command[1:]), version="0.25.0", max_batch=256, read_file=lambda p: "")
    assert got.values["mode"] == "speculative" and got.values["spec_disable_threshold"] == threshold
    sgl = plan_apply(read_command(sglang_argv(k)), threshold, top=256, out_dir="/o", version=None)
    files = {"/o/" + SGLANG_CONFIG_FILE: sgl.files[SGLANG_CONFIG_FILE]}
    got = sim_settings("sglang", list(sgl.command[3:]), version=None, max_batch=256, read_file=files.__getitem__)
    assert got.values["spec_disable_threshold"] == threshold and got.info["speculative_adaptive"] is True
    doc = {"speculative_config": {"decoding_type": "Eagle3", "max_draft_len": k, "speculative_model": "/m/d"}}
    trt = plan_apply(read_command(trtllm_argv(), read_file={"opts.yaml": yaml.safe_dump(doc)}.__getitem__), threshold,
                     top=256, out_dir="/o", version=None)
    files = {trt.command[-1]: trt.files[TRTLLM_OPTIONS_FILE]}
    got = sim_settings("trtllm", list(trt.command[1:]), version=None, max_batch=256, read_file=files.__getitem__)
    assert got.values["mode"] == "speculative" and got.values["spec_disable_threshold"] == threshold
