"""Parking real CUDA processes by the driver's checkpoint, on a GPU host (the device issue 37), all
figures of one run:

    python benchmarks/bench_park_device.py OUT [--hold-gib 100] [--floor-gib 8] [--rounds 3]
                                               [--server auto|transformers|gpu_openai] [--model PATH] [--sim]

1. **The floor**: the host<->device bandwidth as torch copies it (a pinned host tensor of
   ``--floor-gib`` to the GPU and back, ``--rounds`` times): no checkpoint of N GiB can be faster than
   N over the device-to-host figure, nor a restore than N over host-to-device.
2. **A torch process holding ``--hold-gib``** (a pattern written, its sum kept), started as a unit
   (``gpuslate up hold --ready-log ...``): ``gpuslate park hold --method checkpoint`` (the driver's lock
   and checkpoint, NVML's proof that it left the GPU), ``gpuslate resume hold`` (room, restore, unlock,
   the memory back), then the process asked (SIGUSR1) to sum its memory again: the same sum, or the
   restore lost data. Then a cold stop and start (``down``, ``up``) for comparison.
3. **A real server of one process**: ``transformers serve`` (with ``--model PATH``: the device has no
   network) or, without it, benchmarks/gpu_openai_server.py (a Llama-shaped network on the GPU), as a
   unit: the first request before; ``park`` (checkpoint), ``resume`` (with its warm-up and the reference
   answer: the same tokens as before the park), the first request after the resume; then ``restart``
   (a cold stop and start) and the first request after it.

Every step has its own time limit and is reported even when another fails. ``--sim`` dry-runs steps 2
and 3 on a simulated host (``sim hold``, ``sim serve``: the simulated driver's checkpoint) and skips
the floor (no GPU): what can be checked without the device. Needs the ``park`` extra (cuda-core,
cuda-bindings) on a real host: ``pip install '.[park]'``; its absence is said, not guessed around.
Writes ``OUT/park_device.json`` and a log.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GiB = 1024**3

FLOOR = r"""
import json, sys, time, torch
n, rounds = int(sys.argv[1]), int(sys.argv[2])
host = torch.empty(n, dtype=torch.uint8, pin_memory=True); host.fill_(7)
dev = torch.empty(n, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize()
h2d, d2h = [], []
for _ in range(rounds):
    t = time.perf_counter(); dev.copy_(host, non_blocking=True); torch.cuda.synchronize(); h2d.append(time.perf_counter() - t)
    t = time.perf_counter(); host.copy_(dev, non_blocking=True); torch.cuda.synchronize(); d2h.append(time.perf_counter() - t)
print(json.dumps({"bytes": n, "h2d_s": h2d, "d2h_s": d2h, "h2d_gbps": n / min(h2d) / 1e9, "d2h_gbps": n / min(d2h) / 1e9,
                  "device": torch.cuda.get_device_name(0)}))
"""

HOLDER = r"""
import os, signal, sys, torch
n = int(sys.argv[1])
x = torch.empty(n, dtype=torch.uint8, device="cuda")
x.copy_(torch.arange(n, dtype=torch.int64, device="cuda").remainder_(251).to(torch.uint8)); torch.cuda.synchronize()
first = int(x.sum(dtype=torch.int64))
def again(*_):
    print(f"sum {int(x.sum(dtype=torch.int64))} first {first}", flush=True)
signal.signal(signal.SIGUSR1, again)
print(f"holding {n} bytes, sum {first}", flush=True)
while True:
    signal.pause()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Run:
    def __init__(self, out: Path, env: dict[str, str]) -> None:
        self.out, self.env = out, env
        self.log = open(out / "park_device.log", "a")

    def say(self, line: str) -> None:
        print(line, flush=True)
        self.log.write(line + "\n")
        self.log.flush()

    def gs(self, *args: str, timeout: float = 600) -> tuple[int, dict[str, Any] | None, float, str]:
        """``gpuslate ARGS --json``: exit code, its document, the wall time, its stderr."""
        t = time.monotonic()
        try:
            p = subprocess.run([sys.executable, "-m", "gpuslate", *args, "--json"], capture_output=True, text=True,
                               env=self.env, timeout=timeout, cwd=self.out)
        except subprocess.TimeoutExpired:
            return 124, None, time.monotonic() - t, f"timed out after {timeout:g} s"
        wall = time.monotonic() - t
        try:
            doc = json.loads(p.stdout) if p.stdout.strip() else None
        except ValueError:
            doc = None
        self.say(f"$ gpuslate {' '.join(args)}: exit {p.returncode} in {wall:.3f} s")
        if p.returncode:
            self.say("  " + p.stderr.strip().replace("\n", "\n  ")[-2000:])
        return p.returncode, doc, wall, p.stderr


def request(port: int, model: str | None, timeout: float = 120) -> dict[str, Any]:
    """One chat completion of 16 tokens at temperature 0; its latency, or the error."""
    import urllib.request

    t = time.monotonic()
    try:
        if model is None:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=timeout) as r:
                model = json.loads(r.read())["data"][0]["id"]
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": "The capital of France is"}],
                           "max_tokens": 16, "temperature": 0}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
        return {"ok": True, "latency_s": round(time.monotonic() - t, 4)}
    except Exception as exc:
        return {"ok": False, "latency_s": round(time.monotonic() - t, 4), "error": str(exc)[:300]}


def park_cycle(run: Run, name: str) -> dict[str, Any]:
    """``park NAME --method checkpoint`` then ``resume NAME``, each document's figures kept."""
    rc, doc, wall, _ = run.gs("park", name, "--method", "checkpoint")
    out: dict[str, Any] = {"park": {"exit": rc, "wall_s": wall, "status": doc and doc.get("status"),
                                    "timings": doc and doc.get("timings"), "host_bytes": doc and doc.get("host_bytes"),
                                    "reason": doc and doc.get("reason"),
                                    "proof_gpus": doc and doc.get("proof") and doc["proof"]["gpus"]}}
    if rc:
        return out
    rc, snap, _, _ = run.gs("status")
    out["status_parked"] = snap and snap.get("parked")
    rc, doc, wall, _ = run.gs("resume", name)
    out["resume"] = {"exit": rc, "wall_s": wall, "status": doc and doc.get("status"),
                     "timings": doc and doc.get("timings"), "answer": doc and doc.get("answer"),
                     "reason": doc and doc.get("reason")}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--hold-gib", type=float, default=100.0)
    ap.add_argument("--floor-gib", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--server", choices=("auto", "transformers", "gpu_openai"), default="auto")
    ap.add_argument("--model", help="a model folder for transformers serve (the device has no network)")
    ap.add_argument("--sim", action="store_true", help="a dry run on a simulated host (no GPU)")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="park-device-"))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "GPUSLATE_STATE_DIR": str(tmp / "state"), "GPUSLATE_LOCK_DIR": str(tmp / "locks"), "PYTHONUNBUFFERED": "1"}
    if args.sim:
        subprocess.run([sys.executable, "-m", "gpuslate", "sim", "init", str(tmp / "host"), "--count", "1",
                        "--memory", f"{int(args.hold_gib) + 40}GiB"], env=env, check=True, capture_output=True)
        env["GPUSLATE_SIM"] = str(tmp / "host")
    else:
        env.pop("GPUSLATE_SIM", None)
    run = Run(out, env)
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "sim": args.sim,
                              "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs",
                              "command": " ".join(["benchmarks/bench_park_device.py", *sys.argv[1:]])}
    if not args.sim:
        try:
            import cuda.core.checkpoint  # noqa: F401 - lazy: optional (the park extra), only asked whether it is here
            result["park_extra"] = "installed"
        except ImportError as exc:
            result["park_extra"] = f"missing: {exc} (pip install '.[park]')"
            run.say(f"the park extra is missing ({exc}): the checkpoint steps will be refused, and say so")
        nvsmi = shutil.which("nvidia-smi")
        if nvsmi:
            q = subprocess.run([nvsmi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                               capture_output=True, text=True)
            result["gpus"] = q.stdout.strip().splitlines()
    # 1. the floor
    if args.sim:
        result["floor"] = {"skipped": "a simulated host has no GPU to copy to"}
    else:
        p = subprocess.run([sys.executable, "-c", FLOOR, str(int(args.floor_gib * GiB)), str(args.rounds)],
                           capture_output=True, text=True, timeout=600)
        result["floor"] = json.loads(p.stdout) if p.returncode == 0 else {"error": p.stderr[-1000:]}
        run.say(f"floor: {json.dumps(result['floor'])[:400]}")
    # 2. a process holding --hold-gib
    nbytes = int(args.hold_gib * GiB)
    hold_cmd = ([sys.executable, "-m", "gpuslate", "sim", "hold", "--memory", f"{nbytes}B", "--gpus", "0"]
                if args.sim else [sys.executable, "-c", HOLDER, str(nbytes)])
    ready = '"ready": true' if args.sim else "holding"
    t = time.monotonic()
    rc, doc, wall, _ = run.gs("up", "hold", "--gpus", "0", "--ready-log", ready, "--start-timeout", "600", "--",
                              *hold_cmd)
    hold: dict[str, Any] = {"up": {"exit": rc, "wall_s": wall, "time_to_ready_s": doc and doc.get("time_to_ready_s")}}
    if rc == 0:
        hold.update(park_cycle(run, "hold"))
        if not args.sim and doc is not None:  # the same bytes after the restore: the holder sums them again
            os.kill(int(doc["pid"]), signal.SIGUSR1)
            time.sleep(5)
            lines = [ln for ln in Path(doc["log"]).read_text().splitlines() if ln.startswith("sum ")]
            hold["sum_after"] = lines[-1] if lines else None
            hold["same_data"] = bool(lines) and lines[-1].split()[1] == lines[-1].split()[3]
        t = time.monotonic()
        rc, _, _, _ = run.gs("down", "hold")
        rc2, doc2, _, _ = run.gs("up", "hold")
        hold["cold_stop_start_s"] = time.monotonic() - t if rc == 0 and rc2 == 0 else None
        run.gs("down", "hold")
    result["holder"] = hold
    # 3. a real server of one process
    port = free_port()
    server = args.server
    if server == "auto":
        server = "transformers" if args.model and shutil.which("transformers") else "gpu_openai"
    if args.sim:
        server, cmd = "sim", [sys.executable, "-m", "gpuslate", "sim", "serve", "--port", str(port),
                              "--startup-seconds", "5", "--memory", "20GiB"]
    elif server == "transformers":
        cmd = ["transformers", "serve", "--port", str(port), "--force-model", str(args.model)]
    else:
        cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_openai_server.py"), "--port", str(port), "--size", "1b"]
    srv: dict[str, Any] = {"server": server, "command": cmd}
    rc, doc, wall, _ = run.gs("up", "srv", "--gpus", "0", "--port", str(port), "--ready", "/v1/models",
                              "--start-timeout", "900", "--", *cmd)
    srv["up"] = {"exit": rc, "wall_s": wall, "time_to_ready_s": doc and doc.get("time_to_ready_s")}
    if rc == 0:
        srv["first_request"] = request(port, None)
        srv.update(park_cycle(run, "srv"))
        srv["first_request_after_resume"] = request(port, None)
        t = time.monotonic()
        rc, doc, wall, _ = run.gs("restart", "srv", timeout=900)
        srv["restart"] = {"exit": rc, "wall_s": wall, "downtime_s": doc and doc.get("downtime_s")}
        srv["first_request_after_restart"] = request(port, None)
        run.gs("down", "srv")
    result["server"] = srv
    (out / "park_device.json").write_text(json.dumps(result, indent=2) + "\n")
    run.say(json.dumps(result, indent=2))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
