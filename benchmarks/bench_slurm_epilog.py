"""The time `gpuslate slurm epilog` adds to every job on a clean node (issue 18; goal <= 0.3 s).

    python3 benchmarks/bench_slurm_epilog.py [--rounds 20] [--gpus 8] [--script PATH] [--out FILE]
    python3 benchmarks/bench_slurm_epilog.py --nvml [--script PATH] [--out FILE]   # on a GPU host

No Slurm is needed: the environment Slurm gives an Epilog is faked (SLURM_JOB_ID,
SLURM_JOB_UID = this user, SLURM_JOB_GPUS = every GPU, SLURMD_NODENAME) and PATH
holds no scontrol, which the clean path never calls. Without --nvml a simulated
host of --gpus GPUs in a temporary folder is the node; with --nvml the real
driver is (every GPU must be free: the clean path is what is measured). Each
round times, interleaved: the interpreter's floor (`python -c pass`), and the
epilog (exit 0 is checked: a node that is not clean fails the run).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _timing import interpreter_of, report, summarize, time_commands

FLOOR = "python -c pass (floor)"
EPILOG = "gpuslate slurm epilog (clean node)"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--gpus", type=int, default=8, help="GPUs of the simulated node (ignored with --nvml)")
    ap.add_argument("--nvml", action="store_true", help="the real NVIDIA driver instead of a simulated host")
    ap.add_argument("--script", help="an installed `gpuslate` console script (default: python -m gpuslate)")
    ap.add_argument("--out", help="write the run (JSON) here")
    a = ap.parse_args()

    src = str(Path(__file__).resolve().parents[1] / "src")
    py = interpreter_of(a.script) if a.script else sys.executable
    gs = [a.script] if a.script else [py, "-m", "gpuslate"]
    with tempfile.TemporaryDirectory(prefix="gpuslate-bench-epilog-") as tmp:
        no_scontrol = Path(tmp) / "bin"
        no_scontrol.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "GPUSLATE_"))}
        if not a.script:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
        env["GPUSLATE_STATE_DIR"] = str(Path(tmp) / "state")
        if a.nvml:
            count = _nvml_gpus(gs, env)
        else:
            count = a.gpus
            sim = Path(tmp) / "sim"
            subprocess.run([*gs, "sim", "init", str(sim), "--count", str(count)], env=env, check=True,
                           stdout=subprocess.DEVNULL)
            env["GPUSLATE_SIM"] = str(sim)
        env.update({"SLURM_JOB_ID": "4242", "SLURM_JOB_UID": str(os.getuid()), "SLURM_JOB_GPUS": f"0-{count - 1}",
                    "SLURMD_NODENAME": platform.node().split(".")[0] or "node", "PATH": str(no_scontrol)})
        check = subprocess.run([*gs, "slurm", "epilog", "--json"], env=env, capture_output=True, text=True)
        if check.returncode != 0:
            raise SystemExit(f"the node is not clean (exit {check.returncode}): {check.stderr.strip()}")
        times = time_commands({FLOOR: [py, "-c", "pass"], EPILOG: [*gs, "slurm", "epilog"]}, a.rounds, env=env)
    rows = summarize(times, FLOOR)
    meta = {"bench": "slurm-epilog", "backend": "nvml" if a.nvml else "sim", "gpus": count,
            "machine": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": " ".join(sys.argv),
            "epilog_doc": json.loads(check.stdout)}
    report(meta, rows, times, a.out)
    epilog_ms = next(r["median_ms"] for r in rows if r["command"] == EPILOG)
    print(f"epilog median {epilog_ms} ms: goal <= 300 ms {'met' if float(epilog_ms) <= 300 else 'NOT met'}")


def _nvml_gpus(gs: list[str], env: dict[str, str]) -> int:
    p = subprocess.run([*gs, "status", "--json"], env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"gpuslate status failed (exit {p.returncode}): {p.stderr.strip()}")
    return len(json.loads(p.stdout)["gpus"])


if __name__ == "__main__":
    main()
