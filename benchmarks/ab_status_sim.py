"""`status`'s own work (snapshot, JSON, table) in two source trees, on one simulated host held by a
launcher and 8 workers: an A/B that needs no GPU (bench_status.py, on a GPU host, times the whole
command against nvitop and gpustat).

    python3 benchmarks/ab_status_sim.py OLD_SRC NEW_SRC [--rounds 200] [--pairs 5]

Each tree is measured in an interpreter of its own, the two alternating ``--pairs`` times (so that
the load of the machine falls on both alike); each measurement is the median and the minimum over
``--rounds`` calls, in milliseconds, after 5 not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

PROBE = r"""
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
from gpuslate.gpu.simhost import SimBackend
from gpuslate.host.snapshot import take_snapshot
from gpuslate.cli.render.status import status_lines
be, rounds, out = SimBackend(sys.argv[2]), int(sys.argv[3]), {}
for name, f in (("snapshot", lambda: take_snapshot(be)), ("json", lambda: json.dumps(take_snapshot(be).to_json())),
                ("table", lambda: status_lines(take_snapshot(be), color=False, width=None))):
    for _ in range(5):
        f()
    ts = []
    for _ in range(rounds):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    out[name] = [round(statistics.median(ts) * 1000, 3), round(min(ts) * 1000, 3)]
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--pairs", type=int, default=5)
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="ab-status-") + "/host"
    env = {**os.environ, "PYTHONPATH": a.new}
    subprocess.run([sys.executable, "-m", "gpuslate", "sim", "init", root], env=env, check=True, capture_output=True)
    holder = subprocess.Popen([sys.executable, "-m", "gpuslate", "--sim", root, "sim", "hold", "--gpus", "0-7",
                               "--memory", "1GiB", "--workers", "8"], env=env, stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        holder.stdout.readline()  # type: ignore[union-attr]
        runs: dict[str, list[dict[str, list[float]]]] = {"old": [], "new": []}
        for _ in range(a.pairs):
            for name in ("old", "new"):
                r = subprocess.run([sys.executable, "-c", PROBE, getattr(a, name), root, str(a.rounds)],
                                   capture_output=True, text=True, check=True)
                runs[name].append(json.loads(r.stdout))
        for what in ("snapshot", "json", "table"):
            for name in ("old", "new"):
                med = sorted(r[what][0] for r in runs[name])
                low = min(r[what][1] for r in runs[name])
                print(f"{what:8} {name}: median of medians {med[len(med) // 2]:.2f} ms, minimum {low:.2f} ms")
    finally:
        os.killpg(holder.pid, 9)
        holder.wait()


if __name__ == "__main__":
    main()
