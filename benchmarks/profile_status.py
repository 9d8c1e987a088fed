"""Where the time of one `gpuslate status --json` goes, phase by phase.

    python3 benchmarks/profile_status.py [--runs 15]

Each run is a fresh interpreter (as a real invocation is); the table gives
the median of each phase in milliseconds.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = r"""
import time, json, sys
t0 = time.perf_counter(); ph = {}
def mark(name):
    global t0
    t = time.perf_counter(); ph[name] = (t - t0) * 1000; t0 = t
import pynvml; mark("import pynvml")
import gpuslate.cli.main; mark("import gpuslate CLI")
from gpuslate.gpu import open_backend; from gpuslate.host.snapshot import take_snapshot
from gpuslate.proc.fdscan import scan_device_holders
b = open_backend(); mark("nvmlInit")
n = b.device_count(); mark("device count")
r = b.read(None, full=True); mark("read GPUs (full)")
r = b.read(None, full=False); mark("read GPUs (memory+processes)")
s = scan_device_holders(b.device_prefixes()); mark("fd scan")
snap = take_snapshot(b); mark("whole snapshot")
out = json.dumps(snap.to_json(), indent=2); mark("JSON")
b.close(); mark("nvmlShutdown")
print(json.dumps(ph))
"""


def main() -> None:
    runs = int(sys.argv[sys.argv.index("--runs") + 1]) if "--runs" in sys.argv else 15
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)
    phases: dict[str, list[float]] = {}
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, check=True)
        for k, v in json.loads(out.stdout).items():
            phases.setdefault(k, []).append(v)
    print("| phase | median ms |\n|---|---|")
    for k, v in phases.items():
        print(f"| {k} | {statistics.median(v):.2f} |")


if __name__ == "__main__":
    main()
