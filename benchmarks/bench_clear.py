"""`gpuslate clear` end to end vs the ad-hoc command it replaces vs the driver's teardown floor.

    python3 benchmarks/bench_clear.py [--reps 3] [--out results.json]

Run on a GPU host. Scenarios: one process holding 120 GiB; a launcher with
8 worker processes holding 15 GiB each. For each repetition and scenario,
side by side:

* floor: SIGKILL the holders, then a tight NVML loop until the memory is
  released (the driver's own teardown time; no tool can be faster);
* gpuslate: `gpuslate clear --pid LAUNCHER --json` from process start to its
  verified-free exit;
* seed: `fuser -k /dev/nvidia*; sleep 2; nvidia-smi | grep MiB | head -4`.
  It kills every process holding a GPU, so it is only run when every holder
  is a process this script started; otherwise a scoped equivalent
  (`kill -9 OUR PIDS; sleep 2; nvidia-smi ...`) is timed and marked so.

This script never holds an NVML handle itself while the seed command runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import select
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GiB = 1024**3

HOLDER = r"""
import sys, torch
x = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device="cuda"); x.fill_(1); torch.cuda.synchronize()
print("ready", flush=True); sys.stdin.read()
"""
TREE = r"""
import subprocess, sys
n, each = int(sys.argv[1]), sys.argv[2]
kids = [subprocess.Popen([sys.executable, "-c", sys.argv[3], each], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True) for _ in range(n)]
for k in kids:
    assert k.stdout.readline().strip() == "ready"
print("ready", " ".join(str(k.pid) for k in kids), flush=True); sys.stdin.read()
"""
# SIGKILL the given pids, then spin on NVML until the GPU is free; print seconds.
FLOOR = r"""
import os, sys, time, pynvml
pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0)
pids = [int(p) for p in sys.argv[1:]]
t0 = time.perf_counter()
for p in pids: os.kill(p, 9)
while True:
    m = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    if m.used <= 64 * 2**20 and not pynvml.nvmlDeviceGetComputeRunningProcesses(h):
        break
print(time.perf_counter() - t0)
"""
CHECK = r"""
import pynvml; pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0)
m = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
print(m.used, len(pynvml.nvmlDeviceGetComputeRunningProcesses(h)))
"""
SEED = "fuser -k /dev/nvidia* 2>/dev/null; sleep 2; nvidia-smi | grep MiB | head -4"


def start(scenario: str) -> tuple[subprocess.Popen[str], list[int]]:
    py = sys.executable
    if scenario == "1x120GiB":
        args = [py, "-c", HOLDER, str(120 * GiB)]
    else:
        args = [py, "-c", TREE, "8", str(15 * GiB), HOLDER]
    p = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
    select.select([p.stdout], [], [], 300)
    line = p.stdout.readline().split()
    assert line and line[0] == "ready", "holder did not start"
    return p, [p.pid, *map(int, line[1:])]


def gpu_check(env: dict[str, str]) -> tuple[int, int]:
    used, n = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, env=env,
                             check=True).stdout.split()
    return int(used), int(n)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out")
    ap.add_argument("--script", help="an installed `gpuslate` console script to time (default: python -m gpuslate)")
    a = ap.parse_args()
    env = dict(os.environ)
    if not a.script:  # an installed script brings its own package (and its bytecode)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)
    gs = [a.script] if a.script else [sys.executable, "-m", "gpuslate"]
    env.pop("GPUSLATE_SIM", None)
    # gpuslate is timed in two interpreter set-ups (see bench_status.py): bytecode
    # as the environment has it, and cached as after a normal `pip install`.
    cached = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    cached["PYTHONPYCACHEPREFIX"] = "/tmp/gpuslate-bench-pycache"
    subprocess.run([sys.executable, "-c", "import pynvml, gpuslate.cli.main, gpuslate.slate.clear, gpuslate.slate.plan,"
                    "gpuslate.cli.clear, gpuslate.slate.wait, gpuslate.host.audit, gpuslate.host.lock"], env=cached, check=True)
    variants = {"gpuslate": env, "gpuslate (bytecode cached)": cached}
    if env.get("PYTHONDONTWRITEBYTECODE") is None:
        variants = {"gpuslate": env}
    methods = ["floor", *variants, "seed"]
    rows: list[dict] = []
    for rep in range(a.reps):
        for scenario in ("1x120GiB", "8x15GiB"):
            for method in methods:
                p, pids = start(scenario)
                rec: dict = {"rep": rep, "scenario": scenario, "method": method}
                try:
                    if method == "floor":
                        out = subprocess.run([sys.executable, "-c", FLOOR, *map(str, pids)], capture_output=True,
                                             text=True, env=env, check=True)
                        rec["seconds"] = float(out.stdout)
                    elif method in variants:
                        t0 = time.perf_counter()
                        out = subprocess.run([*gs, "clear", "--gpus", "0", "--pid",
                                              str(p.pid), "--json"], capture_output=True, text=True,
                                             env=variants[method])
                        rec["seconds"] = time.perf_counter() - t0
                        doc = json.loads(out.stdout)
                        rec.update(status=doc["status"], timings=doc["timings"], exit_code=out.returncode)
                    else:
                        held = subprocess.run("fuser /dev/nvidia* 2>/dev/null", shell=True, capture_output=True,
                                              text=True).stdout.split()
                        holders = {int(x.rstrip("acefFrm")) for x in held}
                        ours = set(pids)
                        cmd = SEED if holders <= ours else \
                            f"kill -9 {' '.join(map(str, pids))}; sleep 2; nvidia-smi | grep MiB | head -4"
                        rec["variant"] = "as typed" if cmd == SEED else "scoped to our pids (other holders present)"
                        t0 = time.perf_counter()
                        out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True)
                        rec["seconds"] = time.perf_counter() - t0
                        rec["seed_output"] = out.stdout.strip()
                    used, nproc = gpu_check(env)
                    rec["after_used"], rec["after_processes"] = used, nproc
                    rec["verified_free_after"] = used <= 64 * 2**20 and nproc == 0
                finally:
                    try:
                        os.killpg(p.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    p.wait()
                    # let the GPU settle before the next setup
                    while gpu_check(env)[0] > 64 * 2**20:
                        time.sleep(0.05)
                rows.append(rec)
                print(json.dumps({k: v for k, v in rec.items() if k != "seed_output"}), flush=True)
    summary = []
    for scenario in ("1x120GiB", "8x15GiB"):
        med = {m: statistics.median(r["seconds"] for r in rows if r["scenario"] == scenario and r["method"] == m)
               for m in methods}
        for v in variants:
            summary.append({"scenario": scenario, "variant": v, "floor_ms": round(med["floor"] * 1000, 1),
                            "gpuslate_ms": round(med[v] * 1000, 1), "seed_ms": round(med["seed"] * 1000, 1),
                            "gpuslate_minus_floor_ms": round((med[v] - med["floor"]) * 1000, 1),
                            "seed_over_gpuslate": round(med["seed"] / med[v], 2),
                            "false_clean": sum(1 for r in rows if r["scenario"] == scenario and r["method"] == v
                                               and r.get("status") == "clean" and not r["verified_free_after"])})
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "host": platform.node(),
            "python": platform.python_version(), "reps": a.reps,
            "command": "python3 benchmarks/bench_clear.py " + " ".join(sys.argv[1:]),
            "gpuslate_invoked_as": " ".join(gs), "env_PYTHONDONTWRITEBYTECODE": env.get("PYTHONDONTWRITEBYTECODE")}
    print(json.dumps(meta))
    keys = list(summary[0])
    print("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for s in summary:
        print("| " + " | ".join(str(s[k]) for k in keys) + " |")
    if a.out:
        Path(a.out).write_text(json.dumps({"meta": meta, "summary": summary, "runs": rows}, indent=1))


if __name__ == "__main__":
    main()
