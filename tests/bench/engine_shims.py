"""Stand-ins named like the engines (gpuslate.engines.standin): a ``vllm`` and a ``trtllm-serve``
program on PATH and an ``sglang`` package with ``launch_server`` on PYTHONPATH, each running
``gpuslate sim serve --emulate``. An experiment's deployments can then be declared exactly as on
GPUs (``vllm serve MODEL --speculative-config '{...}'``, ``python -m sglang.launch_server ...
--speculative-algorithm EAGLE3``, ``trtllm-serve MODEL --extra_llm_api_options FILE.yaml``) and run
on a simulated host; the simulated server reads the engine's arguments by the engine's rules."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gpuslate.engines import standin
from gpuslate.engines.trtllm import dump_yaml

# a wider margin either side of the crossover than the defaults' 15% / 13% (accept length 3.6: 1.38x at
# concurrency 1, 0.82x at 4), so that a short run on a loaded machine still decides
SIM = ["--memory", "40GiB", "--startup-seconds", "0.5", "--time-scale", "10", "--accept-length", "3.6"]
VERSIONS = {"vllm": "0.25.0", "sglang": "0.5.11", "trtllm": "1.3.0"}
FORMS = {"vllm": ("vllm", "serve"), "sglang": ("-m", "sglang.launch_server"), "trtllm": ("trtllm-serve",)}


def install(folder: Path, *, sim: tuple[str, ...] = (), patched_flag: str | None = None) -> dict[str, str]:
    """Write the stand-ins into ``folder``; the environment variables that put them first
    (``GPUSLATE_TEST_SHIM_PY``: the folder of the Python stand-ins). ``sim``: more flags of the
    simulated server (``--switch-ms``); ``patched_flag``: the engines are patched to take it."""
    env: dict[str, str] = {}
    for engine, form in FORMS.items():
        serve = [sys.executable, "-m", "gpuslate", "sim", "serve", "--emulate", engine, "--engine-version",
                 VERSIONS[engine], *SIM, *sim, *(("--patched-flag", patched_flag.lstrip("-")) if patched_flag else ())]
        env.update(standin.write(folder, form, serve))
    return {"PATH": env["PATH"], "GPUSLATE_TEST_SHIM_PY": str(folder / "py")}


def engine_spec(path: Path, port: int, engine: str, *, levels: tuple[int, ...] = (1, 4), requests: int = 12,
                repeats: int = 2, verify: int = 1, extra: tuple[str, ...] = (), shim_py: str = "",
                src: str = "", threshold_flag: str | None = None, output_len: int = 48) -> Path:
    """An experiment of a baseline and a speculative deployment of ``engine`` (vllm | sglang | trtllm),
    declared as that engine's own command lines, on one port."""
    env = ""
    if engine == "vllm":
        base = ["vllm", "serve", "org/model", "--port", str(port), "--max-num-seqs", "64"]
        spec = base + ["--speculative-config", json.dumps({"method": "eagle3", "model": "org/eagle3-draft",
                                                           "num_speculative_tokens": 3}), *extra]
    elif engine == "trtllm":
        options = path.parent / "eagle3.yaml"
        options.write_text(dump_yaml({"speculative_config": {"decoding_type": "Eagle3", "max_draft_len": 3,
                                                             "speculative_model": "/m/eagle3-draft"},
                                      "kv_cache_config": {"free_gpu_memory_fraction": 0.85}}))
        base = ["trtllm-serve", "/m/target", "--tp_size", "8", "--port", str(port), "--max_batch_size", "64"]
        spec = base + ["--extra_llm_api_options", str(options), *extra]
    else:
        base = [sys.executable, "-m", "sglang.launch_server", "--model-path", "org/model", "--port", str(port)]
        spec = base + ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "org/eagle3-draft",
                       "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                       "--speculative-num-draft-tokens", "4", *extra]
        env = f"env = {{ PYTHONPATH = {json.dumps(shim_py + ':' + src)} }}\n"

    def unit(name: str, command: list[str], more: str = "") -> str:
        return (f"[units.{name}]\ncommand = {json.dumps(command)}\ngpus = \"0-7\"\nport = {port}\n"
                f"engine = \"{engine}\"\nstart_timeout = 30\ngrace = 5\n{env}{more}\n")

    flag = f"threshold_flag = {json.dumps(threshold_flag)}\n" if threshold_flag else ""
    path.write_text(f"[experiment]\nname = \"{engine}\"\ntime_scale = 10\nverify = {verify}\n\n"
                    f"[load]\nconcurrency = {list(levels)}\nrequests = {requests}\nrepeats = {repeats}\n"
                    f"warmup = 2\ninput_len = 32\noutput_len = {output_len}\nseed = 5\n\n"
                    + unit("baseline", base) + unit("speculative", spec, flag))
    return path
