"""Swap overhead: total `gpuslate swap` time minus the old server's teardown and the new
server's own startup, i.e. what gpuslate itself adds to a hand-off.

    python benchmarks/bench_swap.py [--rounds 10] [--out results/bench_swap.json]   # simulated host
    python benchmarks/bench_swap.py --real [--gpus 0]                                 # real GPUs (torch server)

Each round swaps A -> B (then B -> A, ...) through the CLI, as a user would run it,
and measures:

* ``wall``: the `gpuslate swap --json` command, start to exit (includes Python start-up);
* ``total``: the swap as gpuslate timed it (``total_s``);
* ``teardown``: the old server's own exit and its memory release (``stop_old_s + verify_clean_s``);
* ``startup``: the new server's own startup, from spawning it to the moment the server itself
  says it was ready (``ready_at`` of /get_server_info), so readiness-poll latency is counted
  as gpuslate's, not the server's;
* ``overhead`` = total - teardown - startup, and ``overhead_wall`` = wall - teardown - startup.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str, env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "gpuslate", *args], capture_output=True, text=True, env=env, timeout=900)
    return time.perf_counter() - t0, r


def server_ready_at(port: int) -> float | None:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/get_server_info", timeout=5) as resp:
            return json.loads(resp.read()).get("ready_at")
    except OSError:
        return None


def sim_units(tmp: Path, port: int, startup: float) -> tuple[dict[str, list[str]], list[str], dict[str, str]]:
    host = tmp / "host"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "GPUSLATE_SIM": str(host),
           "GPUSLATE_STATE_DIR": str(tmp / "state"), "GPUSLATE_LOCK_DIR": str(tmp / "locks")}
    subprocess.run([sys.executable, "-m", "gpuslate", "sim", "init", str(host), "--release-delay", "0.2"],
                   env=env, check=True, capture_output=True)
    serve = [sys.executable, "-m", "gpuslate", "sim", "serve", "--port", str(port), "--startup-seconds", str(startup),
             "--memory", "20GiB"]
    return {"A": serve, "B": [*serve, "--mode", "speculative"]}, ["--gpus", "0-7"], env


def real_units(tmp: Path, port: int, gpus: str) -> tuple[dict[str, list[str]], list[str], dict[str, str]]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("units_real", ROOT / "tests" / "gpu" / "test_units_real.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    script = tmp / "torch_server.py"
    script.write_text(mod.TORCH_SERVER)
    env = {k: v for k, v in os.environ.items() if k != "GPUSLATE_SIM"}
    env.update({"PYTHONPATH": str(ROOT / "src"), "GPUSLATE_STATE_DIR": str(tmp / "state"),
                "GPUSLATE_LOCK_DIR": str(tmp / "locks")})
    serve = [sys.executable, str(script), "--port", str(port), "--workers", "2", "--memory-gib", "4"]
    return {"A": [*serve, "--name", "A"], "B": [*serve, "--name", "B"]}, ["--gpus", gpus], env


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--real", action="store_true", help="real GPUs through NVML and a torch server")
    ap.add_argument("--gpus", default="0", help="with --real: GPUs of the units (default 0)")
    ap.add_argument("--startup", type=float, default=0.5, help="simulated server startup seconds (default 0.5)")
    ap.add_argument("--out", type=Path, help="write the JSON results here")
    a = ap.parse_args()
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rows: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="bench-swap-") as d:
        tmp = Path(d)
        cmds, gpu_args, env = real_units(tmp, port, a.gpus) if a.real else sim_units(tmp, port, a.startup)
        for name, cmd in cmds.items():  # run each once so both specs are recorded; then only A runs
            _, r = cli("up", name, *gpu_args, "--port", str(port), "--engine", "sglang", "--", *cmd, env=env)
            if r.returncode != 0:
                raise SystemExit(f"up {name} failed: {r.stderr}")
            cli("down", name, env=env)
        cli("up", "A", env=env)
        try:
            old, new = "A", "B"
            for _ in range(a.rounds):
                wall, r = cli("swap", old, new, "--json", env=env)
                if r.returncode != 0:
                    raise SystemExit(f"swap {old} {new} failed ({r.returncode}): {r.stderr}")
                doc = json.loads(r.stdout)
                ph = doc["phases"]
                teardown = ph["stop_old_s"] + ph["verify_clean_s"]
                ready_at = server_ready_at(port)
                launched = doc["up"]["launched_at"]
                spawned = _epoch(launched)
                startup = ready_at - spawned if ready_at else ph["ready_new_s"]
                rows.append({"wall_s": wall, "total_s": doc["total_s"], "teardown_s": teardown,
                             "startup_s": startup, "overhead_s": doc["total_s"] - teardown - startup,
                             "overhead_wall_s": wall - teardown - startup, "probe_ready_s": ph["ready_new_s"],
                             "lock_wait_s": ph["lock_wait_s"], "preflight_s": ph["preflight_new_s"],
                             "launch_s": ph["launch_new_s"]})
                old, new = new, old
        finally:
            for n in cmds:
                cli("down", n, env=env)
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    worst = {k: max(r[k] for r in rows) for k in rows[0]}
    where = f"real GPUs {a.gpus} (torch server)" if a.real else f"simulated host, 8 GPUs, startup {a.startup} s"
    print(f"### swap overhead: {where}, {a.rounds} swaps\n")
    print("| measure | median (s) | max (s) |\n| --- | ---: | ---: |")
    for k in ("wall_s", "total_s", "teardown_s", "startup_s", "probe_ready_s", "preflight_s", "launch_s",
              "overhead_s", "overhead_wall_s"):
        print(f"| {k[:-2]} | {med[k]:.3f} | {worst[k]:.3f} |")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({"where": where, "rounds": rows, "median": med, "max": worst,
                                     "python": sys.version.split()[0], "host": os.uname().nodename}, indent=2))
    return 0


def _epoch(iso: str) -> float:
    import calendar

    base, ms = iso.rstrip("Z").split(".")
    return calendar.timegm(time.strptime(base, "%Y-%m-%dT%H:%M:%S")) + int(ms) / 1000


if __name__ == "__main__":
    sys.exit(main())
