"""Reading the speculative deployment's own command and writing what its engine needs (pure):
every form of the vLLM and SGLang command lines gpuslate reads, what it cannot read (named, and
nothing written), the settings that block the knob, the versions, and the command lines written."""

from __future__ import annotations

import json
import shlex

import pytest

from gpuslate.engines import (
    COMMAND_FILE,
    ApplyStatus,
    VersionStatus,
    detect,
    plan_apply,
    plan_as_measured,
    read_command,
)
from gpuslate.engines.sglang import ARGS_FILE as SGLANG_ARGS_FILE
from gpuslate.engines.sglang import CONFIG_FILE as SGLANG_CONFIG_FILE
from gpuslate.engines.vllm import CONFIG_FILE as VLLM_CONFIG_FILE
from gpuslate.engines.vllm import ENGINE as VLLM_ENGINE

SPEC = {"method": "eagle3", "model": "org/EAGLE3-draft", "num_speculative_tokens": 3, "draft_tensor_parallel_size": 1}
VLLM = ["vllm", "serve", "org/model", "--port", "8000", "--speculative-config", json.dumps(SPEC),
        "--max-num-seqs", "64"]
SGLANG = ["python3", "-m", "sglang.launch_server", "--model-path", "org/model", "--port", "30000",
          "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "org/draft",
          "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]


def applied(argv, threshold=2, *, version="0.25.1", facts=None, top=64):
    return plan_apply(read_command(argv, facts), threshold, top=top, out_dir="/runs/x", version=version)


def spec_config_of(argv: list[str]) -> dict:
    i = argv.index("--speculative-config")
    return json.loads(argv[i + 1])


# -- vLLM --------------------------------------------------------------------------------


def test_vllm_config_kept_whole_with_the_schedule_added():
    plan = applied(VLLM)
    assert plan.status is ApplyStatus.READY and plan.version_status is VersionStatus.HAS_KNOB
    written = json.loads(plan.files[VLLM_CONFIG_FILE])
    assert written == {**SPEC, "num_speculative_tokens_per_batch_size": [[1, 2, 3], [3, 64, 0]]}
    # the whole command line: the same program, model and flags, the config replaced where it was
    cmd = list(plan.command)
    assert cmd[:6] == VLLM[:6] and cmd[7:] == VLLM[7:] and spec_config_of(cmd) == written
    assert shlex.split(plan.files[COMMAND_FILE]) == cmd
    assert "fixed K = 3" in plan.measured and "K = 0 (no speculation) above" in plan.does
    assert any("prefills included" in u for u in plan.unproven)


@pytest.mark.parametrize("form", [
    ["--speculative-config=" + json.dumps(SPEC)],
    ["--speculative_config", json.dumps(SPEC)],  # vLLM takes --foo_bar for --foo-bar
])
def test_vllm_config_forms(form):
    argv = ["vllm", "serve", "m", "--port", "1", *form]
    plan = applied(argv)
    assert plan.status is ApplyStatus.READY
    assert spec_config_of(list(plan.command))["num_speculative_tokens_per_batch_size"] == [[1, 2, 3], [3, 64, 0]]
    assert plan.command[:5] == ("vllm", "serve", "m", "--port", "1") and len(plan.command) == 7


def test_vllm_python_module_and_env_prefix():
    argv = ["env", "VLLM_USE_V1=1", "python3", "-u", "-m", "vllm.entrypoints.openai.api_server", "--model", "m",
            "--speculative-config", json.dumps(SPEC)]
    assert detect(argv)[0] is VLLM_ENGINE
    plan = applied(argv)
    assert plan.status is ApplyStatus.READY and plan.command[:6] == tuple(argv[:6])


def test_vllm_older_flags_become_one_speculative_config():
    argv = ["vllm", "serve", "m", "--speculative-model", "org/draft", "--num-speculative-tokens", "5",
            "--speculative-draft-tensor-parallel-size", "1", "--port", "9"]
    cmd = read_command(argv)
    assert cmd.k == 5 and cmd.config == {"model": "org/draft", "num_speculative_tokens": 5,
                                         "draft_tensor_parallel_size": 1}
    plan = plan_apply(cmd, 4, top=16, out_dir="/x", version="0.25.0")
    assert plan.command == ("vllm", "serve", "m", "--speculative-config",
                            json.dumps({**cmd.config, "num_speculative_tokens_per_batch_size": [[1, 4, 5], [5, 16, 0]]},
                                       separators=(",", ":")), "--port", "9")
    assert any("older flags" in n for n in plan.notes)


@pytest.mark.parametrize("argv, missing", [
    (["vllm", "serve", "m"], "runs no speculative decoding"),
    (["vllm", "serve", "m", "--config", "c.yaml"], "--config FILE may hold it"),
    (["vllm", "serve", "m", "--speculative-config", '{"method": "eagle3", "model": "d"}'], "num_speculative_tokens"),
    (["vllm", "serve", "m", "--speculative-config", '{"num_speculative_tokens": 3}'], "method and model"),
    (["vllm", "serve", "m", "--speculative-config", "{method: eagle}"], "not JSON"),
    (["vllm", "serve", "m", "--speculative-config", "[1]"], "not a JSON object"),
    (["vllm", "serve", "m", "--speculative-config.method", "eagle3"], "dotted"),
    (["vllm", "serve", "m", "--speculative-config", json.dumps(SPEC), "--num-speculative-tokens", "2"], "both"),
    (["serve-my-model", "--port", "1"], "none gpuslate reads"),
    (["bash", "-c", "vllm serve m"], "none gpuslate reads"),
])
def test_what_cannot_be_read_is_named_and_nothing_written(argv, missing):
    plan = applied(argv)
    assert plan.status is ApplyStatus.UNREADABLE and not plan.files and not plan.command
    assert any(missing in m for m in plan.missing), plan.missing


def test_vllm_data_parallel_blocks_the_schedule():
    for dp in (["--data-parallel-size", "2"], ["-dp", "4"], ["--data-parallel-size=2"]):
        plan = applied([*VLLM, *dp])
        assert plan.status is ApplyStatus.BLOCKED and not plan.files
        assert "data parallelism > 1" in plan.blockers[0].why
    assert applied([*VLLM, "--data-parallel-size", "1"]).status is ApplyStatus.READY


@pytest.mark.parametrize("version, status", [
    ("0.25.0", VersionStatus.HAS_KNOB), ("0.26.3", VersionStatus.HAS_KNOB), ("1.0.0", VersionStatus.HAS_KNOB),
    ("0.24.2", VersionStatus.NO_KNOB), ("0.11.0", VersionStatus.NO_KNOB), ("0.24.1.dev40+gabc", VersionStatus.UNKNOWN),
    (None, VersionStatus.UNKNOWN),
])
def test_vllm_versions(version, status):
    assert VLLM_ENGINE.version_status(version)[0] is status
    plan = applied(VLLM, version=version)
    if status is VersionStatus.NO_KNOB:
        assert plan.status is ApplyStatus.BLOCKED and not plan.files
        said = " ".join(plan.notes)
        assert "no upstream switch" in said and "--speculative-disable-batch-threshold" in said and "routing" in said
    else:
        assert plan.status is ApplyStatus.READY


# -- SGLang ------------------------------------------------------------------------------


def test_sglang_arguments_and_a_config_whose_on_side_is_the_measured_steps():
    plan = applied(SGLANG, 1, version="0.5.11")
    assert plan.status is ApplyStatus.READY
    cfg = json.loads(plan.files[SGLANG_CONFIG_FILE])
    assert {k: v for k, v in cfg.items() if k.isdigit()} == {"1": {"candidate_steps": [3]},
                                                             "2": {"candidate_steps": [0]}}
    assert cfg["candidate_steps"] == [3]  # the flat loader's tripwire (one value: it refuses the file)
    args = ["--speculative-adaptive", "--speculative-adaptive-config", "/runs/x/" + SGLANG_CONFIG_FILE]
    assert shlex.split(plan.files[SGLANG_ARGS_FILE]) == args
    assert plan.command == (*SGLANG, *args) and shlex.split(plan.files[COMMAND_FILE]) == list(plan.command)
    assert any("draft model's extend" in u for u in plan.unproven)
    assert plan.version_status is VersionStatus.UNKNOWN and "#24055" in plan.versions


def test_sglang_abbreviations_nextn_and_a_replaced_adaptive_config():
    argv = ["python", "-m", "sglang.launch_server", "--speculative-algo", "NEXTN", "--speculative-num-steps=2",
            "--speculative-adaptive", "--speculative-adaptive-config", "old.json", "--port", "1"]
    cmd = read_command(argv)
    assert cmd.method == "NEXTN" and cmd.k == 2 and not cmd.blockers
    plan = plan_apply(cmd, 8, top=64, out_dir="/o", version=None)
    assert plan.command == ("python", "-m", "sglang.launch_server", "--speculative-algo", "NEXTN",
                            "--speculative-num-steps=2", "--port", "1", "--speculative-adaptive",
                            "--speculative-adaptive-config", "/o/" + SGLANG_CONFIG_FILE)
    assert any("not a fixed step count" in n for n in plan.notes)


@pytest.mark.parametrize("extra, setting", [
    (["--speculative-eagle-topk", "4"], "--speculative-eagle-topk 4"),
    (["--enable-dp-attention"], "--enable-dp-attention"),
    (["--enable-multi-layer-eagle"], "--enable-multi-layer-eagle"),
    (["--enable-two-batch-overlap"], "--enable-two-batch-overlap"),
    (["--enable-pdmux"], "--enable-pdmux"),
])
def test_sglang_setups_where_adaptive_falls_back_to_static(extra, setting):
    plan = applied([*SGLANG, *extra])
    assert plan.status is ApplyStatus.BLOCKED and not plan.files
    assert [b.setting for b in plan.blockers] == [setting] and "static" in plan.blockers[0].why


def test_sglang_other_algorithm_blocks():
    argv = ["python3", "-m", "sglang.launch_server", "--speculative-algorithm", "NGRAM", "--speculative-num-steps", "3"]
    plan = applied(argv)
    assert plan.status is ApplyStatus.BLOCKED and "EAGLE and EAGLE3" in plan.blockers[0].why


def test_sglang_steps_from_the_running_server_and_blockers_it_reports():
    argv = ["python3", "-m", "sglang.launch_server", "--speculative-algorithm", "EAGLE3"]
    assert any("--speculative-num-steps" in m for m in read_command(argv).missing)
    cmd = read_command(argv, {"speculative_num_steps": 5, "speculative_eagle_topk": 1})
    assert cmd.k == 5 and cmd.topk == 1 and any("server reported 5" in n for n in cmd.notes)
    dp = read_command(argv, {"speculative_num_steps": 5, "enable_dp_attention": True})
    assert [b.setting for b in dp.blockers] == ["--enable-dp-attention"]  # set by a --config file, say


# -- the simulator and the recommendation as measured ------------------------------------


def test_the_simulators_own_flag_is_not_an_engine_file():
    argv = ["python3", "-m", "gpuslate", "sim", "serve", "--port", "7", "--mode", "speculative",
            "--spec-disable-threshold", "9"]
    plan = applied(argv, 1, version=None)
    assert plan.status is ApplyStatus.READY and set(plan.files) == {COMMAND_FILE}
    assert plan.command == (*argv[:-2], "--spec-disable-threshold", "1")
    assert "simulator" in plan.does and "no engine takes" in plan.does
    assert applied(argv[:-4], 1).status is ApplyStatus.UNREADABLE  # no --mode speculative


def test_the_simulator_emulating_an_engine_reads_the_engines_arguments():
    argv = ["gpuslate", "sim", "serve", "--emulate", "vllm", "--", *VLLM[1:]]
    plan = applied(argv, 1)
    assert plan.engine == "vllm" and plan.status is ApplyStatus.READY
    assert spec_config_of(list(plan.command))["num_speculative_tokens_per_batch_size"][0] == [1, 1, 3]


def test_always_off_and_never_disable_are_measured_deployments_as_they_ran():
    plan = plan_as_measured("always_off", ["base", "--x"], "vllm", "0.25.0")
    assert plan.status is ApplyStatus.AS_MEASURED and plan.command == ("base", "--x")
    assert "the baseline deployment" in plan.does
    assert "speculative deployment" in plan_as_measured("never_disable", VLLM, "vllm", None).does


# -- TensorRT-LLM ------------------------------------------------------------------------

TRT_OPTIONS = {"speculative_config": {"decoding_type": "Eagle3", "max_draft_len": 3, "speculative_model": "/m/e3",
                                      "eagle3_one_model": True},
               "kv_cache_config": {"free_gpu_memory_fraction": 0.85}, "cuda_graph_config": {"max_batch_size": 64}}
TRT = ["trtllm-serve", "/m/target", "--tp_size", "8", "--port", "8000", "--extra_llm_api_options", "opts.yaml"]


def trt_applied(argv=TRT, options=TRT_OPTIONS, threshold=2, version="1.3.0"):
    import yaml

    files = {"opts.yaml": options if isinstance(options, str) else yaml.safe_dump(options)}
    return plan_apply(read_command(argv, read_file=files.__getitem__), threshold, top=64, out_dir="/runs/x",
                      version=version)


def test_trtllm_options_file_kept_whole_with_the_schedule_added():
    import yaml

    from gpuslate.engines.trtllm import OPTIONS_FILE

    plan = trt_applied()
    assert plan.status is ApplyStatus.READY and plan.engine == "trtllm"
    written = yaml.safe_load(plan.files[OPTIONS_FILE])
    assert written == {**TRT_OPTIONS, "speculative_config": {**TRT_OPTIONS["speculative_config"],
                                                             "draft_len_schedule": {1: 3, 2: 3, 3: 0}}}
    assert plan.command == (*TRT[:-1], "/runs/x/" + OPTIONS_FILE)  # the same command, the new file in place
    assert shlex.split(plan.files[COMMAND_FILE]) == list(plan.command)
    assert "PR #10860" in plan.unproven[0] and any("#16888" in u for u in plan.unproven)
    assert plan.version_status is VersionStatus.UNKNOWN and "max_concurrency: T" in plan.versions
    # its --config name is kept as written; a measured max_concurrency is dropped (mutually exclusive)
    alt = trt_applied([*TRT[:-2], "--config", "opts.yaml"], {
        **TRT_OPTIONS, "speculative_config": {**TRT_OPTIONS["speculative_config"], "max_concurrency": 8}})
    assert alt.command[-2] == "--config" and "max_concurrency" not in yaml.safe_load(alt.files[OPTIONS_FILE])[
        "speculative_config"]
    assert any("max_concurrency" in n and "dropped" in n for n in alt.notes)


@pytest.mark.parametrize("argv, options, what", [
    (TRT[:-2], TRT_OPTIONS, "names no options file"),
    (TRT, {"kv_cache_config": {}}, "no speculative_config"),
    (TRT, {"speculative_config": {"decoding_type": "Eagle3"}}, "max_draft_len"),
    (TRT, {"speculative_config": {"max_draft_len": 3}}, "decoding_type"),
    (TRT, "speculative_config: &a {max_draft_len: 3}\nb: *a\n", "anchors or aliases"),
    (TRT, "speculative_config: [unclosed\n", "not YAML"),
    ([*TRT[:-2], "--extra_llm_api_opt", "opts.yaml"], TRT_OPTIONS, "names no options file"),
])
def test_trtllm_what_cannot_be_read_is_named(argv, options, what):
    plan = trt_applied(argv, options)
    assert plan.status is ApplyStatus.UNREADABLE and not plan.files, plan
    assert any(what in m for m in plan.missing), plan.missing


@pytest.mark.parametrize("argv, options, setting", [
    ([*TRT, "--backend", "tensorrt"], TRT_OPTIONS, "--backend tensorrt"),
    (TRT, {"speculative_config": {"decoding_type": "Medusa", "max_draft_len": 3}}, "decoding_type: Medusa"),
    ([*TRT, "--max_batch", "64"], TRT_OPTIONS, "--max_batch"),  # click: no abbreviations
])
def test_trtllm_blockers(argv, options, setting):
    plan = trt_applied(argv, options)
    assert plan.status is ApplyStatus.BLOCKED and not plan.files
    assert [b.setting for b in plan.blockers] == [setting]


# -- a patched engine's own flag ---------------------------------------------------------


def test_a_patched_flag_is_set_in_place_or_added():
    from gpuslate.engines import plan_patched

    flag = "--speculative-disable-batch-threshold"
    plan = plan_patched([*SGLANG, flag, "1024"], flag, 2, version="0.5.11")
    assert plan.status is ApplyStatus.READY and plan.patched_flag == flag and set(plan.files) == {COMMAND_FILE}
    assert plan.command == (*SGLANG, flag, "2") and "relies on a patch" in plan.notes[0]
    # an abbreviation SGLang's argparse takes is the flag; its value is replaced where it is
    plan = plan_patched([*SGLANG[:7], "--speculative-disable=8", *SGLANG[7:]], flag, 3, version=None)
    assert plan.command == (*SGLANG[:7], "--speculative-disable", "3", *SGLANG[7:])
    assert plan_patched(SGLANG, flag, 1, version=None).command == (*SGLANG, flag, "1")  # not there: added
    # through the simulator playing the engine: after its '--', into the engine's arguments
    emu = ["gpuslate", "sim", "serve", "--emulate", "sglang", "--", *SGLANG[3:]]
    assert plan_patched(emu, flag, 1, version=None).command == (*emu, flag, "1")
    # ambiguous: the engine would refuse the command, named
    bad = plan_patched([*SGLANG, "--speculative-d", "4"], flag, 1, version=None)
    assert bad.status is ApplyStatus.BLOCKED and bad.blockers[0].why.startswith("ambiguous option")


# -- parking: what a command makes possible, by its engine's own facts ---------------------------

DEV = {"VLLM_SERVER_DEV_MODE": "1"}


def test_vllm_park_levels_and_what_a_command_lacks():
    from gpuslate.engines import read_park

    r = read_park([*VLLM, "--enable-sleep-mode"], DEV)
    assert r is not None and r.engine == "vllm" and not r.missing and r.method == "eagle3"
    # level 2 with EAGLE3 and CUDA graphs: the draft's graph replay faults after the wake (vLLM #55013)
    assert [(lv.level, h.source if h else None) for lv, h in r.levels] == [(1, None), (2, "vLLM #55013")]
    assert [lv.level for lv in r.usable()] == [1]
    eager = read_park([*VLLM, "--enable-sleep-mode", "--enforce-eager"], DEV)
    assert [lv.level for lv in eager.usable()] == [1, 2]
    assert read_park(VLLM, DEV).missing == ("started without --enable-sleep-mode",)
    assert read_park([*VLLM, "--enable-sleep-mode"], {}).missing == ("started without VLLM_SERVER_DEV_MODE=1",)
    # PyTorch's expandable segments: a sleep frees nothing (vLLM PR #11743), at every level
    exp = read_park([*VLLM, "--enable-sleep", "--enforce-eager"],
                    {**DEV, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments: True"})
    assert "--enable-sleep-mode" in exp.flags  # an abbreviation, as vLLM's argparse takes it
    assert not exp.usable() and all(h is not None and h.source == "vLLM PR #11743" for _, h in exp.levels)


def test_sglang_parks_at_the_level_its_cpu_backup_decides():
    from gpuslate.engines import read_park

    plain = read_park([*SGLANG, "--enable-memory-saver"], {})
    assert [lv.level for lv in plain.usable()] == [2] and plain.model_path == "org/model"
    assert plain.usable()[0].resume_reloads_weights and not plain.usable()[0].offloads
    backed = read_park([*SGLANG, "--enable-memory-saver", "--enable-weights-cpu-backup"], {})
    assert [lv.level for lv in backed.usable()] == [1] and backed.usable()[0].offloads
    assert read_park(SGLANG, {}).missing == ("started without --enable-memory-saver",)
    # the simulator's --emulate carries the engine's arguments: read as the engine's
    sim = read_park(["gpuslate", "sim", "serve", "--emulate", "sglang", "--", *SGLANG[3:], "--enable-memory-saver"], {})
    assert sim is not None and sim.engine == "sglang" and [lv.level for lv in sim.usable()] == [2]
    assert read_park(["trtllm-serve", "m"], {}) is None and read_park(["sleep", "1"], {}) is None


@pytest.mark.parametrize("name", ["vllm", "sglang", "trtllm"])
def test_port_zero_is_a_free_port_not_the_default(name):
    """``--port 0`` binds a free port (the kernel's), as the engines' own servers do: never the default,
    where another server may already listen."""
    from gpuslate.engines import BACKENDS

    e = BACKENDS[name]
    args = {"vllm": ["m"], "sglang": ["--model-path", "m"], "trtllm": ["m"]}[name]
    assert e.emulate([*args, "--port", "0"], version=None, max_batch=8, read_file=lambda p: "").port == 0
    assert e.emulate(args, version=None, max_batch=8, read_file=lambda p: "").port != 0
