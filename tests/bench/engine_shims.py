"""Stand-ins named like the engines, that run ``gpuslate sim serve --emulate``: a ``vllm`` program
on PATH and an ``sglang`` package with ``launch_server`` on PYTHONPATH. An experiment's deployments
can then be declared exactly as on GPUs (``vllm serve MODEL --speculative-config '{...}'``,
``python -m sglang.launch_server ... --speculative-algorithm EAGLE3``) and run on a simulated host;
the simulated server reads the engine's arguments by the engine's rules (gpuslate/simserver/engineargs.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

# a wider margin either side of the crossover than the defaults' 15% / 13% (accept length 3.6: 1.38x at
# concurrency 1, 0.82x at 4), so that a short run on a loaded machine still decides
SIM = ["--memory", "40GiB", "--startup-seconds", "0.5", "--time-scale", "10", "--accept-length", "3.6"]


def install(folder: Path, *, vllm_version: str = "0.25.0", sglang_version: str = "0.5.11") -> dict[str, str]:
    """Write the stand-ins into ``folder``; the environment variables that put them first."""
    bin_dir, pkg = folder / "bin", folder / "py" / "sglang"
    bin_dir.mkdir(parents=True)
    pkg.mkdir(parents=True)
    serve = [sys.executable, "-m", "gpuslate", "sim", "serve"]
    vllm = bin_dir / "vllm"
    vllm.write_text("#!/bin/sh\nexec " + " ".join(json.dumps(a) for a in
                                                  [*serve, "--emulate", "vllm", "--engine-version", vllm_version, *SIM])
                    + ' -- "$@"\n')
    vllm.chmod(0o755)
    (pkg / "__init__.py").write_text("")
    (pkg / "launch_server.py").write_text(
        "import os, sys\n"
        f"os.execv(sys.executable, {[*serve, '--emulate', 'sglang', '--engine-version', sglang_version, *SIM]!r}"
        " + ['--', *sys.argv[1:]])\n")
    return {"PATH": f"{bin_dir}:" + __import__("os").environ.get("PATH", ""), "GPUSLATE_TEST_SHIM_PY": str(pkg.parent)}


def engine_spec(path: Path, port: int, engine: str, *, levels: tuple[int, ...] = (1, 4), requests: int = 12,
                repeats: int = 2, verify: int = 1, extra: tuple[str, ...] = (), shim_py: str = "",
                src: str = "") -> Path:
    """An experiment of a baseline and a speculative deployment of ``engine`` (vllm | sglang),
    declared as that engine's own command lines, on one port."""
    if engine == "vllm":
        base = ["vllm", "serve", "org/model", "--port", str(port), "--max-num-seqs", "64"]
        spec = base + ["--speculative-config", json.dumps({"method": "eagle3", "model": "org/eagle3-draft",
                                                           "num_speculative_tokens": 3}), *extra]
        env = ""
    else:
        base = [sys.executable, "-m", "sglang.launch_server", "--model-path", "org/model", "--port", str(port)]
        spec = base + ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "org/eagle3-draft",
                       "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                       "--speculative-num-draft-tokens", "4", *extra]
        env = f"env = {{ PYTHONPATH = {json.dumps(shim_py + ':' + src)} }}\n"

    def unit(name: str, command: list[str]) -> str:
        return (f"[units.{name}]\ncommand = {json.dumps(command)}\ngpus = \"0-7\"\nport = {port}\n"
                f"engine = \"{engine}\"\nstart_timeout = 30\ngrace = 5\n{env}\n")

    path.write_text(f"[experiment]\nname = \"{engine}\"\ntime_scale = 10\nverify = {verify}\n\n"
                    f"[load]\nconcurrency = {list(levels)}\nrequests = {requests}\nrepeats = {repeats}\n"
                    "warmup = 2\ninput_len = 32\noutput_len = 48\nseed = 5\n\n"
                    + unit("baseline", base) + unit("speculative", spec))
    return path
