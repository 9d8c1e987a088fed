"""The /proc fd scan against `fuser`, with N idle processes on the host (CPU only).

    python3 benchmarks/bench_fdscan.py [--idle 2000] [--rounds 30] [--out results.json]

Starts N idle `sleep` processes and one simulated 8-worker server holding a
simulated host's device files, then times, side by side in the same rounds:
`fuser DEV...` (a C program, process start included), gpuslate's scan
in-process, the scan as a whole `python -c` command, and `gpuslate status --json`.
Every process it starts, it kills at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).parent))
from _timing import report  # noqa: E402

from gpuslate.gpu.simhost.host import SimHost  # noqa: E402
from gpuslate.proc.fdscan import scan_device_holders  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--idle", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--out")
    a = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    tmp = tempfile.mkdtemp(prefix="gpuslate-bench-")
    host = SimHost.init(Path(tmp) / "host", gpus=8)
    env["GPUSLATE_SIM"] = str(host.root)
    devs = sorted(str(p) for p in host.dev.glob("nvidia*"))
    idle = [subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL) for _ in range(a.idle)]
    srv = subprocess.Popen([sys.executable, "-m", "gpuslate", "sim", "hold", "--memory", "10GiB", "--workers", "8"],
                           stdout=subprocess.PIPE, text=True, env=env, start_new_session=True)
    select.select([srv.stdout], [], [], 30)
    ready = json.loads(srv.stdout.readline())
    nproc = sum(1 for n in os.listdir("/proc") if n.isdigit())
    prefixes = (f"{host.dev}/nvidia",)
    scan_cmd = [sys.executable, "-c", "from gpuslate.proc.fdscan import scan_device_holders as s;"
                f"s(({prefixes[0]!r},))"]
    times: dict[str, list[float]] = {"fuser DEV... (command)": [], "gpuslate fd scan (in-process)": [],
                                     "gpuslate fd scan (python -c, whole command)": [],
                                     "gpuslate status --json (whole command)": []}
    try:
        found = scan_device_holders(prefixes).holders
        assert set(ready["workers"]) <= set(found), "scan missed a holder"
        fuser_out = subprocess.run(["fuser", *devs], capture_output=True, text=True)
        fuser_pids = {int(t.rstrip("acefFrm")) for t in fuser_out.stdout.split()}
        assert fuser_pids == set(found), (fuser_pids, set(found))
        for r in range(a.rounds + 2):
            def run(name: str, fn) -> None:
                t0 = time.perf_counter()
                fn()
                if r >= 2:
                    times[name].append((time.perf_counter() - t0) * 1000)
            run("fuser DEV... (command)", lambda: subprocess.run(["fuser", *devs], capture_output=True))
            run("gpuslate fd scan (in-process)", lambda: scan_device_holders(prefixes))
            run("gpuslate fd scan (python -c, whole command)", lambda: subprocess.run(scan_cmd, env=env, check=True))
            run("gpuslate status --json (whole command)",
                lambda: subprocess.run([sys.executable, "-m", "gpuslate", "status", "--json"], env=env,
                                       stdout=subprocess.DEVNULL, check=True))
    finally:
        for p in idle:
            p.kill()
        os.killpg(srv.pid, 9)
        for p in idle:
            p.wait()
        srv.wait()
    ref = statistics.median(times["fuser DEV... (command)"])
    rows = [{"command": n, "median_ms": round(statistics.median(ts), 2), "min_ms": round(min(ts), 2),
             "max_ms": round(max(ts), 2), "x_fuser": round(statistics.median(ts) / ref, 2)} for n, ts in times.items()]
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "host": platform.node(),
            "cpus": os.cpu_count(), "processes_on_host": nproc, "idle_started": a.idle,
            "holders_found": len(found), "rounds": a.rounds,
            "command": "python3 benchmarks/bench_fdscan.py " + " ".join(sys.argv[1:])}
    report(meta, rows, times, a.out)


if __name__ == "__main__":
    main()
