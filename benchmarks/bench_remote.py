"""`gpuslate --host ... status` on 32 loopback hosts against one host, with connection reuse.

    python3 benchmarks/bench_remote.py [--hosts 32] [--rounds 5] [--out results.json]

Starts one real sshd per host on 127.0.0.1 (each its own simulated 8-GPU host,
keys and client ssh_config in a temporary folder; ~/.ssh is never touched),
then times, interleaved round by round:

- the first call (no shared connection yet: every host pays its ssh handshake)
  and a repeated call (ControlMaster connections reused), for 1 host and for N;
- plain ``ssh HOST gpuslate status --json`` to one host (the usual way, no reuse);
- the same fan-out with a remote side that only prints a saved status document
  (``GPUSLATE_REMOTE_COMMAND``): what the transport and the fan-out cost when each
  host computes on its own CPUs, as real hosts do. On one machine the N simulated
  hosts share its cores, so the full ``status`` line also measures N remote
  Pythons competing for them.

Only the sshd processes this script starts are signaled (and the ssh masters it
made are asked to exit with ``ssh -O exit``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests" / "remote")]
from sshd_hosts import sshd_available, start_lab  # noqa: E402


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall ms, CPU ms of the command and its children on this side)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    wall = (time.perf_counter() - t0) * 1000
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise RuntimeError(f"{argv[:6]}... failed ({p.returncode}): {p.stderr.decode()[-800:]}")
    cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out")
    a = ap.parse_args()
    if not sshd_available():
        sys.exit("needs /usr/sbin/sshd and ssh (apt-get install openssh-server openssh-client)")
    base = Path(tempfile.mkdtemp(prefix="gsb-", dir="/tmp"))
    names = [f"h{i:02d}" for i in range(a.hosts)]
    lab = start_lab(base / "lab", names, gpus=8)
    try:
        env = lab.client_env()
        # the remote side of the transport-only lines: a saved document, printed
        doc = subprocess.run([sys.executable, "-m", "gpuslate", "-H", names[0], "status", "--json"], env=env,
                             capture_output=True, text=True, check=True).stdout
        saved = base / "status.json"
        saved.write_text(json.dumps(json.loads(doc)["hosts"][0]["result"]))
        (base / "cached").write_text(f"#!/bin/sh\nexec cat {saved}\n")  # ignores the arguments
        (base / "cached").chmod(0o755)
        cached_env = dict(env, GPUSLATE_REMOTE_COMMAND=str(base / "cached"))
        py = [sys.executable, "-m", "gpuslate"]
        one = [*py, "-H", names[0], "status", "--json"]
        many = [*py, *[w for n in names for w in ("-H", n)], "status", "--json"]
        plain = ["ssh", "-F", str(lab.ssh_config), "-o", "BatchMode=yes", names[0], "gpuslate", "status", "--json"]
        cases = {
            "status 1 host, first call": (one, env, True),
            "status 1 host, repeated": (one, env, False),
            f"status {a.hosts} hosts, first call": (many, env, True),
            f"status {a.hosts} hosts, repeated": (many, env, False),
            "plain ssh HOST gpuslate status --json": (plain, env, False),
            "transport only, 1 host, first call": (one, cached_env, True),
            "transport only, 1 host, repeated": (one, cached_env, False),
            f"transport only, {a.hosts} hosts, first call": (many, cached_env, True),
            f"transport only, {a.hosts} hosts, repeated": (many, cached_env, False),
        }
        times: dict[str, list[float]] = {k: [] for k in cases}
        cpus: dict[str, list[float]] = {k: [] for k in cases}
        for r in range(a.rounds + 1):  # round 0 warms caches and is not kept
            for name, (argv, e, first) in cases.items():
                if first:
                    lab.close_masters()
                elif name.endswith("repeated"):
                    timed(argv, e)  # make sure the shared connections exist
                wall, cpu = timed(argv, e)
                if r:
                    times[name].append(wall)
                    cpus[name].append(cpu)
        rows = []
        for name in cases:
            rows.append({"case": name, "median_ms": round(statistics.median(times[name]), 1),
                         "min_ms": round(min(times[name]), 1), "max_ms": round(max(times[name]), 1),
                         "local_cpu_ms": round(statistics.median(cpus[name]), 1)})
        by = {r["case"]: r["median_ms"] for r in rows}
        ratios = {
            "status repeated: N hosts / 1 host": round(by[f"status {a.hosts} hosts, repeated"]
                                                       / by["status 1 host, repeated"], 2),
            "status first: N hosts / 1 host": round(by[f"status {a.hosts} hosts, first call"]
                                                    / by["status 1 host, first call"], 2),
            "transport repeated: N hosts / 1 host": round(by[f"transport only, {a.hosts} hosts, repeated"]
                                                          / by["transport only, 1 host, repeated"], 2),
            "transport first: N hosts / 1 host": round(by[f"transport only, {a.hosts} hosts, first call"]
                                                       / by["transport only, 1 host, first call"], 2),
            "reuse: 1 host first / repeated": round(by["status 1 host, first call"]
                                                    / by["status 1 host, repeated"], 2),
        }
        meta = {"machine": f"{platform.node()} {platform.processor() or platform.machine()}, "
                           f"{os.cpu_count()} CPUs, {platform.system()} {platform.release()}",
                "python": platform.python_version(), "ssh": subprocess.run(["ssh", "-V"], capture_output=True,
                                                                           text=True).stderr.strip(),
                "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "hosts": a.hosts,
                "sshd_processes": a.hosts, "rounds": a.rounds,
                "command": "python3 benchmarks/bench_remote.py " + " ".join(sys.argv[1:])}
        result = {"meta": meta, "rows": rows, "ratios": ratios, "times_ms": times}
        keys = list(rows[0])
        print("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
        for row in rows:
            print("| " + " | ".join(str(row[k]) for k in keys) + " |")
        for k, v in ratios.items():
            print(f"{k}: {v}x")
        print(json.dumps(meta))
        if a.out:
            Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    finally:
        lab.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
