"""`gpuslate status --json` against the tools it is compared with, side by side.

    python3 benchmarks/bench_status.py [--rounds 20] [--out results.json] [--hold-gib 8]

Run on a GPU host with nvitop and gpustat importable (see README "Benchmarks").
A torch process holding memory is started first so every tool has a process
to report; it is the only process this script starts on the GPU.
"""

from __future__ import annotations

import argparse
import os
import platform
import select
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _timing import report, summarize, time_commands  # noqa: E402

HOLDER = r"""
import sys, torch
x = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device="cuda"); torch.cuda.synchronize()
print("ready", flush=True); sys.stdin.read()
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--hold-gib", type=float, default=8)
    ap.add_argument("--out")
    ap.add_argument("--script", help="an installed `gpuslate` console script to time (default: python -m gpuslate)")
    a = ap.parse_args()
    py = sys.executable
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = dict(os.environ)
    if not a.script:  # an installed script brings its own package (and its bytecode)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    env.pop("GPUSLATE_SIM", None)
    holder = None
    if a.hold_gib > 0:
        holder = subprocess.Popen([py, "-c", HOLDER, str(int(a.hold_gib * 2**30))], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, start_new_session=True)
        select.select([holder.stdout], [], [], 120)
        assert holder.stdout.readline().strip() == "ready"
    gs = [a.script] if a.script else [py, "-m", "gpuslate"]
    base = {
        "python -c pass": [py, "-c", "pass"],
        "python: import pynvml; nvmlInit() (floor)": [py, "-c", "import pynvml; pynvml.nvmlInit()"],
        "gpuslate status --json": [*gs, "status", "--json"],
        "gpuslate status (table)": [*gs, "status"],
        "nvitop --once": [py, "-m", "nvitop", "--once"],
        "gpustat --json": [py, "-m", "gpustat", "--json"],
    }
    # Two interpreter set-ups, timed in the same rounds: bytecode as the
    # environment has it (PYTHONDONTWRITEBYTECODE=1 on some images recompiles
    # every module at every start: pynvml alone is 6,000 lines), and bytecode
    # cached as after a normal `pip install` (PYTHONPYCACHEPREFIX, filled by the
    # warm-up rounds). Every Python tool gets the same treatment.
    as_is = dict(env)
    cached = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    cached["PYTHONPYCACHEPREFIX"] = "/tmp/gpuslate-bench-pycache"
    commands: dict[str, list[str]] = {"nvidia-smi": ["nvidia-smi"]}
    envs: dict[str, dict[str, str]] = {"nvidia-smi": env}
    for label, e in (("bytecode cached", cached), ("bytecode as-is", as_is)):
        if label == "bytecode as-is" and as_is.get("PYTHONDONTWRITEBYTECODE") is None:
            continue
        for name, cmd in base.items():
            commands[f"{name} [{label}]"] = cmd
            envs[f"{name} [{label}]"] = e
    try:
        times = time_commands(commands, a.rounds, envs)
    finally:
        if holder:
            holder.kill()
            holder.wait()
    rows = []
    for label in ("bytecode cached", "bytecode as-is"):
        sub = {k: v for k, v in times.items() if k.endswith(f"[{label}]") or k == "nvidia-smi"}
        if len(sub) > 1:
            rows += summarize(sub, f"python: import pynvml; nvmlInit() (floor) [{label}]")
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "host": platform.node(),
            "python": platform.python_version(), "rounds": a.rounds, "held_gib": a.hold_gib,
            "command": "python3 benchmarks/bench_status.py " + " ".join(sys.argv[1:]),
            "gpuslate_invoked_as": " ".join(gs),
            "env_PYTHONDONTWRITEBYTECODE": env.get("PYTHONDONTWRITEBYTECODE")}
    try:
        meta["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                     capture_output=True, text=True).stdout.strip()
    except OSError:
        pass
    report(meta, rows, times, a.out)


if __name__ == "__main__":
    main()
