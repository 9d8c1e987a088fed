"""Switching between two resident deployments by park, against switching by restart, on a simulated
host (no GPU needed): the figures of issue 34.

    .venv/bin/python benchmarks/bench_park.py [--switches 20] [--startup-s 30] [--sleep-s 0.5] [--wake-s 0.5]
                                              [--engine vllm|sglang] [--cli 4] [--out FILE]

1. A fresh simulated host (one GPU of 96 GiB) and state folder; units ``a`` and ``b``: the emulated
   engine (``sim serve --emulate ENGINE``, 40 GiB each, its park flag given: vLLM's
   ``--enable-sleep-mode`` with ``VLLM_SERVER_DEV_MODE=1``, SGLang's ``--enable-memory-saver
   --enable-weights-cpu-backup``) on distinct ports, each taking ``--startup-s`` to start and
   ``--sleep-s`` / ``--wake-s`` to park and wake (the engine's own time).
2. ``up a``, ``swap a b --park`` (b's first start, cold), then ``--switches`` park switches
   alternating ``swap b a --park`` / ``swap a b --park`` (20: ten each way), through one library
   ``Host`` as an experiment runs them; each one's park proven by NVML, the memory proven back, the
   reference answer the same (else the script fails).
3. The anchor, in the same run: a restart swap (``swap a b``: a stopped and its GPU verified free, b
   started cold and ready), ``a`` started again first.
   Before it, ``--cli N`` more park switches through the command line (``gpuslate swap ... --park``):
   the wall time a user sees, Python's start included.

Printed (and ``--out``: JSON): per park switch its total, the engine's own park and wake calls, and
gpuslate's share (the total less those calls); the restart swap's total; the ratio restart / park
(median). Checks, exit 1 if one fails: every switch parked and resumed (no fallback), gpuslate's share
at most 0.3 s each, and restart / park at least 10 when ``--startup-s`` is 30.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src")]

from gpuslate import Host, UnitSpec  # noqa: E402 - after the path above
from gpuslate.gpu.simhost.host import SimHost  # noqa: E402
from gpuslate.options import SwapOptions  # noqa: E402

GiB = 1024**3


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def unit(name: str, engine: str, args: argparse.Namespace) -> UnitSpec:
    port = free_port()
    head = [sys.executable, "-m", "gpuslate", "sim", "serve", "--startup-seconds", str(args.startup_s),
            "--memory", "40GiB", "--sleep-seconds", str(args.sleep_s), "--wake-seconds", str(args.wake_s),
            "--emulate", engine, "--"]
    if engine == "vllm":
        cmd = [*head, "serve", f"org/{name}", "--port", str(port), "--enable-sleep-mode"]
        env = {"VLLM_SERVER_DEV_MODE": "1"}
    else:
        cmd = [*head, "--model-path", f"org/{name}", "--port", str(port), "--enable-memory-saver",
               "--enable-weights-cpu-backup"]
        env = {}
    return UnitSpec(name, command=cmd, gpus=[0], port=port, engine=engine, env=env,
                    start_timeout=max(120.0, args.startup_s * 4))


def engine_time(doc: dict) -> float:
    """The engine's own park and wake: the park's calls and the resume's calls, as measured."""
    return doc["phases"].get("park_old_s", 0.0) + doc["phases"].get("resume_new_s", 0.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--switches", type=int, default=20)
    ap.add_argument("--startup-s", type=float, default=30.0)
    ap.add_argument("--sleep-s", type=float, default=0.5)
    ap.add_argument("--wake-s", type=float, default=0.5)
    ap.add_argument("--engine", choices=("vllm", "sglang"), default="vllm")
    ap.add_argument("--cli", type=int, default=4)
    ap.add_argument("--out")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-park-"))
    host_dir = tmp / "host"
    SimHost.init(host_dir, gpus=1, memory=96 * GiB)
    os.environ.update(GPUSLATE_SIM=str(host_dir), GPUSLATE_STATE_DIR=str(tmp / "state"),
                      GPUSLATE_LOCK_DIR=str(tmp / "locks"))
    os.environ["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")
    a, b = unit("a", args.engine, args), unit("b", args.engine, args)
    (tmp / "gpuslate.toml").write_text("".join(
        f"[units.{u.name}]\ncommand = {json.dumps(u.command)}\ngpus = \"0\"\nport = {u.port}\n"
        f"engine = \"{u.engine}\"\nenv = {json.dumps(u.env).replace(':', ' =')}\nstart_timeout = {u.start_timeout}\n\n"
        for u in (a, b)))
    os.chdir(tmp)
    failures: list[str] = []
    park: list[dict] = []
    with Host.open(str(host_dir)) as host:
        t0 = time.monotonic()
        assert host.up("a").ok
        first = host.swap("a", "b", SwapOptions(park=True))
        assert first.ok, first.to_json()
        print(f"up a, swap a b --park (b's cold start): {time.monotonic() - t0:.1f} s")
        names = ("b", "a")
        for i in range(args.switches):
            old, new = names[i % 2], names[1 - i % 2]
            s = host.swap(old, new, SwapOptions(park=True))
            doc = s.to_json()
            ok = (s.ok and s.switch == "park" and s.parked is not None and s.parked.proof is not None
                  and s.parked.proof.parked and s.resumed is not None and s.resumed.answer is not None
                  and s.resumed.answer["same"])
            if not ok:
                failures.append(f"switch {i + 1} {old} -> {new}: not a proven park switch: {doc['status']} "
                                f"{doc.get('fallback')}")
            eng = engine_time(doc)
            row = {"n": i + 1, "from": old, "to": new, "total_s": s.total_s, "engine_s": eng,
                   "gpuslate_s": s.total_s - eng, "downtime_s": s.downtime_s,
                   "proof_gpu_used": [g.used for g in s.parked.proof.gpus] if s.parked and s.parked.proof else None}
            park.append(row)
            print(f"  park switch {i + 1:2d} {old} -> {new}: {s.total_s:6.3f} s = engine {eng:.3f} s + gpuslate "
                  f"{s.total_s - eng:.3f} s")
            if s.total_s - eng > 0.3:
                failures.append(f"switch {i + 1}: gpuslate's share {s.total_s - eng:.3f} s > 0.3 s")
        cli = []
        for i in range(args.cli):
            old, new = names[(args.switches + i) % 2], names[1 - (args.switches + i) % 2]
            t = time.monotonic()
            p = subprocess.run([sys.executable, "-m", "gpuslate", "swap", old, new, "--park", "--json"],
                               capture_output=True, text=True, timeout=300)
            wall = time.monotonic() - t
            if p.returncode != 0 or json.loads(p.stdout)["switch"] != "park":
                failures.append(f"cli switch {old} -> {new}: exit {p.returncode}: {p.stderr[-300:]}")
                continue
            doc = json.loads(p.stdout)
            cli.append({"wall_s": wall, "total_s": doc["total_s"], "engine_s": engine_time(doc)})
            print(f"  gpuslate swap {old} {new} --park: {wall:.3f} s wall ({doc['total_s']:.3f} s inside)")
        # the anchor: a restart swap between the same servers (the one serving stopped, the other started cold)
        last = names[(args.switches + len(cli)) % 2]  # serves now
        other = names[1 - (args.switches + len(cli)) % 2]  # parked
        assert host.down(other).ok  # a cold start of it, as a restart swap does
        t = time.monotonic()
        r = host.swap(last, other)
        restart_wall = time.monotonic() - t
        assert r.ok, r.to_json()
        print(f"restart swap {last} -> {other}: {r.total_s:.3f} s (downtime {r.downtime_s:.3f} s)")
        for name in ("a", "b"):
            host.down(name)
    med = statistics.median(x["total_s"] for x in park)
    ratio = r.total_s / med
    share = [x["gpuslate_s"] for x in park]
    summary = {
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d"), "command": " ".join(["benchmarks/bench_park.py", *sys.argv[1:]]),
        "engine": args.engine, "startup_s": args.startup_s, "sleep_s": args.sleep_s, "wake_s": args.wake_s,
        "park_switches": park, "park_median_s": med, "park_max_s": max(x["total_s"] for x in park),
        "engine_median_s": statistics.median(x["engine_s"] for x in park),
        "gpuslate_median_s": statistics.median(share), "gpuslate_max_s": max(share),
        "restart_s": r.total_s, "restart_wall_s": restart_wall, "restart_downtime_s": r.downtime_s,
        "restart_over_park": ratio, "cli": cli, "failures": failures,
    }
    print(f"park switch: median {med:.3f} s (engine {summary['engine_median_s']:.3f} s, gpuslate "
          f"{summary['gpuslate_median_s']:.3f} s median, {summary['gpuslate_max_s']:.3f} s at most); restart swap "
          f"{r.total_s:.3f} s: {ratio:.1f}x the park switch")
    if cli:
        print(f"through the command line: median {statistics.median(c['wall_s'] for c in cli):.3f} s wall")
    if args.startup_s >= 30 and ratio < 10:
        failures.append(f"restart / park {ratio:.1f} < 10")
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    for f in failures:
        print(f"FAILED: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
