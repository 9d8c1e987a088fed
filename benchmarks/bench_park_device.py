"""Parking real CUDA processes by the driver's checkpoint, on a GPU host (the device issue 37), all
figures of one run:

    python benchmarks/bench_park_device.py OUT [--hold-gib 100] [--floor-gib 8] [--rounds 3]
                                               [--server auto|transformers|gpu_openai] [--model PATH] [--sim]
                                               [--skip-holder] [--skip-server]

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

The server goes first (the smaller, surer figures), the holder last. Before the holder, the host's
memory is read (``/proc/meminfo``); a park into host memory is refused by gpuslate when it does not
fit, and on a virtual machine whose memory grows as it is used (MemTotal starts low) the script touches
the memory once in a child process first, which the log says. If the park of ``--hold-gib`` is refused
for host memory all the same, the holder is started again at the largest size that fits and the
refusal is kept in the results. Every step has its own time limit and is reported even when another
fails. ``--sim`` dry-runs steps 2
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
n, chunk = int(sys.argv[1]), 256 << 20
x = torch.empty(n, dtype=torch.uint8, device="cuda")
for i in range(0, n, chunk):  # a pattern that moves with the offset: a page restored elsewhere shows
    c = min(chunk, n - i)
    x[i:i + c].copy_(torch.arange(i, i + c, dtype=torch.int64, device="cuda").remainder_(251).to(torch.uint8))
torch.cuda.synchronize()
def sums():
    return [int(x[i:i + chunk].sum(dtype=torch.int64)) for i in range(0, n, chunk)]
first = sums()
def again(*_):
    print(f"sums {'same' if sums() == first else 'DIFFERENT'} chunks {len(first)} total {sum(first)}", flush=True)
signal.signal(signal.SIGUSR1, again)
print(f"holding {n} bytes, {len(first)} chunks, total {sum(first)}", flush=True)
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


def request(port: int, model: str | None = None, timeout: float = 120) -> dict[str, Any]:
    """One completion of 16 tokens at temperature 0 (the completions API: ``transformers serve``
    answers it; its chat API refuses some fields): its latency and text, or the error."""
    import urllib.request

    t = time.monotonic()
    try:
        if model is None:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=timeout) as r:
                model = json.loads(r.read())["data"][0]["id"]
        body = json.dumps({"model": model, "prompt": "the first words of the day are", "max_tokens": 16,
                           "temperature": 0, "seed": 0}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            doc = json.loads(r.read())
        return {"ok": True, "latency_s": round(time.monotonic() - t, 4), "text": doc["choices"][0].get("text")}
    except Exception as exc:
        return {"ok": False, "latency_s": round(time.monotonic() - t, 4), "error": str(exc)[:300]}


def meminfo() -> dict[str, int]:
    out = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            k, _, v = line.partition(":")
            if k in ("MemTotal", "MemAvailable", "MemFree"):
                out[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return out


def touch_host_memory(nbytes: int, run: Run) -> dict[str, Any]:
    """Touch ``nbytes`` of host memory once in a child (then free it): on a virtual machine whose memory
    grows as it is used, MemTotal and MemAvailable read low until then, and a park that moves memory
    into the host is refused on that reading."""
    before = meminfo()
    t = time.monotonic()
    code = ("import mmap, sys\nn = int(sys.argv[1]); m = mmap.mmap(-1, n)\n"
            "for i in range(0, n, 1 << 30):\n    m[i:i + (1 << 30)] = bytes(min(1 << 30, n - i))\n")
    p = subprocess.run([sys.executable, "-c", code, str(nbytes)], capture_output=True, text=True, timeout=300)
    after = meminfo()
    out = {"bytes": nbytes, "seconds": round(time.monotonic() - t, 2), "exit": p.returncode,
           "before": before, "after": after, "stderr": p.stderr[-500:]}
    run.say(f"host memory touched ({nbytes / GiB:.0f} GiB, exit {p.returncode}) in {out['seconds']} s: "
            f"{before} -> {after}")
    return out


def park_cycle(run: Run, name: str, pid_alone: bool) -> dict[str, Any]:
    """``park NAME --method checkpoint``, the proof read again from outside (``status``: the process
    off NVML's list; ``wait --free``: the GPU free, where the unit was alone on it), then ``resume
    NAME``; each document's figures kept."""
    rc, doc, wall, _ = run.gs("park", name, "--method", "checkpoint")
    out: dict[str, Any] = {"park": {"exit": rc, "wall_s": wall, "status": doc and doc.get("status"),
                                    "timings": doc and doc.get("timings"), "host_bytes": doc and doc.get("host_bytes"),
                                    "reason": doc and doc.get("reason"),
                                    "proof": doc and doc.get("proof")}}
    if rc:
        return out
    rc, snap, _, _ = run.gs("status", "--gpus", "0")
    out["status_parked"] = snap and snap.get("parked")
    if snap:
        listed = [(p.get("pid"), p.get("kind"), p.get("used_memory")) for g in snap.get("gpus", []) for p in g.get("processes", [])]
        out["gpu_processes_while_parked"] = listed  # (pid, kind, memory): NVML's list and open device files
        out["gpu_used_while_parked"] = [g.get("memory", {}).get("used") for g in snap.get("gpus", [])]
    if pid_alone:
        rc, wdoc, wall, _ = run.gs("wait", "--free", "--gpus", "0", "--timeout", "10s")
        out["wait_free_while_parked"] = {"exit": rc, "wall_s": wall}
    rc, doc, wall, _ = run.gs("resume", name)
    out["resume"] = {"exit": rc, "wall_s": wall, "status": doc and doc.get("status"),
                     "timings": doc and doc.get("timings"), "answer": doc and doc.get("answer"),
                     "reason": doc and doc.get("reason"), "back": doc and doc.get("back")}
    return out


def ratios(cycle: dict[str, Any], floor: dict[str, Any]) -> dict[str, Any]:
    """The park's and the resume's driver calls against the floor: the bytes moved over the measured
    device-to-host (park) and host-to-device (resume) bandwidth."""
    moved = (cycle.get("park") or {}).get("host_bytes")
    pt = ((cycle.get("park") or {}).get("timings") or {}).get("park_s")
    rt = ((cycle.get("resume") or {}).get("timings") or {}).get("resume_s")
    if not moved or "d2h_gbps" not in floor:
        return {}
    d2h, h2d = moved / (floor["d2h_gbps"] * 1e9), moved / (floor["h2d_gbps"] * 1e9)
    return {"moved_bytes": moved, "floor_park_s": round(d2h, 4), "floor_resume_s": round(h2d, 4),
            "park_over_floor": pt and round(pt / d2h, 3), "resume_over_floor": rt and round(rt / h2d, 3)}


def server_command(server: str, port: int, model: str | None) -> list[str]:
    if server == "transformers":
        ts = (["transformers", "serve"] if shutil.which("transformers") else
              [sys.executable, "-c", "import sys; from transformers.cli.transformers import main; "
               "sys.argv[0] = 'transformers'; main()", "serve"])
        return [*ts, str(model), "--port", str(port), "--host", "127.0.0.1"]  # transformers 5: the model positional
    return [sys.executable, str(ROOT / "benchmarks" / "gpu_openai_server.py"), "--port", str(port), "--size", "1b"]


def server_step(run: Run, args: argparse.Namespace, floor: dict[str, Any]) -> dict[str, Any]:
    port = free_port()
    server = args.server
    if server == "auto":
        server = "transformers" if args.model else "gpu_openai"
    if args.sim:
        server, cmd = "sim", [sys.executable, "-m", "gpuslate", "sim", "serve", "--port", str(port),
                              "--startup-seconds", "5", "--memory", "20GiB"]
    else:
        cmd = server_command(server, port, args.model)
    srv: dict[str, Any] = {"server": server, "command": cmd}
    # transformers serve names a local model by its path, and its /v1/models lists only the hub cache's
    # (empty here: on the H100, 2026-12-05, the park was refused for a reference it could not ask for):
    # the unit says its model, and the requests name it
    model_id = args.model if server == "transformers" else None
    rc, doc, wall, _ = run.gs("up", "srv", "--gpus", "0", "--port", str(port), "--ready", "/v1/models",
                              *(["--model", model_id] if model_id else []),
                              "--start-timeout", "900s", "--", *cmd, timeout=960)
    srv["up"] = {"exit": rc, "wall_s": wall, "time_to_ready_s": doc and doc.get("time_to_ready_s")}
    if rc:
        rc2, logs, _, _ = run.gs("logs", "srv")
        srv["logs"] = logs
        return srv
    srv["first_request"] = request(port, model_id)
    srv["second_request"] = request(port, model_id)  # warm: what a request costs when nothing happened
    srv.update(park_cycle(run, "srv", pid_alone=True))
    srv["first_request_after_resume"] = request(port, model_id)
    srv["same_text_after_resume"] = srv["first_request_after_resume"].get("text") == srv["first_request"].get("text")
    srv["ratios"] = ratios(srv, floor)
    rc, doc, wall, _ = run.gs("restart", "srv", timeout=960)
    srv["restart"] = {"exit": rc, "wall_s": wall, "downtime_s": doc and doc.get("downtime_s")}
    srv["first_request_after_restart"] = request(port, model_id)
    srv["same_text_after_restart"] = srv["first_request_after_restart"].get("text") == srv["first_request"].get("text")
    park = (srv.get("park") or {}).get("timings") or {}
    resume = (srv.get("resume") or {}).get("timings") or {}
    switch = (srv.get("park") or {}).get("wall_s", 0) + (srv.get("resume") or {}).get("wall_s", 0)
    srv["summary"] = {"park_wall_s": (srv.get("park") or {}).get("wall_s"), "park_call_s": park.get("park_s"),
                      "resume_wall_s": (srv.get("resume") or {}).get("wall_s"), "resume_call_s": resume.get("resume_s"),
                      "first_after_resume_s": srv["first_request_after_resume"].get("latency_s"),
                      "restart_wall_s": srv["restart"]["wall_s"],
                      "first_after_restart_s": srv["first_request_after_restart"].get("latency_s"),
                      "restart_over_park_resume": switch and round(srv["restart"]["wall_s"] / switch, 2)}
    run.gs("down", "srv")
    return srv


def holder_step(run: Run, args: argparse.Namespace, gib: float, floor: dict[str, Any]) -> dict[str, Any]:
    nbytes = int(gib * GiB)
    hold_cmd = ([sys.executable, "-m", "gpuslate", "sim", "hold", "--memory", f"{nbytes}B", "--gpus", "0"]
                if args.sim else [sys.executable, "-c", HOLDER, str(nbytes)])
    ready = '"ready": true' if args.sim else "holding"
    rc, doc, wall, _ = run.gs("up", "hold", "--gpus", "0", "--ready-log", ready, "--start-timeout", "600s", "--",
                              *hold_cmd, timeout=660)
    hold: dict[str, Any] = {"gib": gib, "up": {"exit": rc, "wall_s": wall,
                                               "time_to_ready_s": doc and doc.get("time_to_ready_s")}}
    if rc:
        return hold
    hold.update(park_cycle(run, "hold", pid_alone=True))
    hold["ratios"] = ratios(hold, floor)
    if not args.sim and doc is not None and (hold.get("resume") or {}).get("exit") == 0:
        os.kill(int(doc["pid"]), signal.SIGUSR1)  # the same bytes after the restore: the holder sums again
        log = Path(doc["log"])
        deadline = time.monotonic() + 120
        lines: list[str] = []
        while time.monotonic() < deadline and not lines:
            lines = [ln for ln in log.read_text().splitlines() if ln.startswith("sums ")]
            time.sleep(0.2)  # polling the holder's log: it writes the line when its sums are done
        hold["sums_after"] = lines[-1] if lines else None
        hold["same_data"] = bool(lines) and lines[-1].split()[1] == "same"
    t = time.monotonic()
    rc, _, _, _ = run.gs("down", "hold")
    rc2, _, _, _ = run.gs("up", "hold", timeout=660)
    hold["cold_stop_start_s"] = time.monotonic() - t if rc == 0 and rc2 == 0 else None
    run.gs("down", "hold")
    return hold


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--hold-gib", type=float, default=100.0)
    ap.add_argument("--floor-gib", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--server", choices=("auto", "transformers", "gpu_openai"), default="auto")
    ap.add_argument("--model", help="a model folder for transformers serve (the device has no network)")
    ap.add_argument("--sim", action="store_true", help="a dry run on a simulated host (no GPU)")
    ap.add_argument("--skip-holder", action="store_true")
    ap.add_argument("--skip-server", action="store_true")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="park-device-"))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "GPUSLATE_STATE_DIR": str(tmp / "state"), "GPUSLATE_LOCK_DIR": str(tmp / "locks"), "PYTHONUNBUFFERED": "1",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_CACHE": str(tmp / "hf-cache")}
    (tmp / "hf-cache").mkdir()  # transformers serve lists the hub cache on /v1/models and fails without it
    if args.sim:
        subprocess.run([sys.executable, "-m", "gpuslate", "sim", "init", str(tmp / "host"), "--count", "1",
                        "--memory", f"{int(args.hold_gib) + 40}GiB"], env=env, check=True, capture_output=True)
        env["GPUSLATE_SIM"] = str(tmp / "host")
    else:
        env.pop("GPUSLATE_SIM", None)
    run = Run(out, env)
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "sim": args.sim,
                              "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs",
                              "command": " ".join(["benchmarks/bench_park_device.py", *sys.argv[1:]]),
                              "meminfo_start": meminfo()}
    if not args.sim:
        try:
            import cuda.core  # lazy: optional (the park extra), only asked whether it is here
            from cuda.core import checkpoint  # noqa: F401
            result["park_extra"] = f"cuda-core {getattr(cuda.core, '__version__', '?')}"
        except ImportError as exc:
            result["park_extra"] = f"missing: {exc} (pip install '.[park]')"
            run.say(f"the park extra is missing ({exc}): the checkpoint steps will be refused, and say so")
        nvsmi = shutil.which("nvidia-smi")
        if nvsmi:
            q = subprocess.run([nvsmi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                               capture_output=True, text=True)
            result["gpus"] = q.stdout.strip().splitlines()
    run.say(f"machine: {result['machine']}; GPUs {result.get('gpus')}; {result.get('park_extra')}; "
            f"meminfo {result['meminfo_start']}")
    # 1. the floor
    if args.sim:
        result["floor"] = {"skipped": "a simulated host has no GPU to copy to"}
    else:
        p = subprocess.run([sys.executable, "-c", FLOOR, str(int(args.floor_gib * GiB)), str(args.rounds)],
                           capture_output=True, text=True, timeout=600)
        result["floor"] = json.loads(p.stdout) if p.returncode == 0 else {"error": p.stderr[-1000:]}
        run.say(f"floor: {json.dumps(result['floor'])[:400]}")
    floor = result["floor"]

    def save() -> None:
        (out / "park_device.json").write_text(json.dumps(result, indent=2) + "\n")

    # 2. a real server of one process
    if not args.skip_server:
        result["server"] = server_step(run, args, floor)
        save()
    # 3. a process holding --hold-gib (host memory first)
    if not args.skip_holder:
        nbytes = int(args.hold_gib * GiB)
        need = nbytes + max(8 * GiB, int(0.1 * result["meminfo_start"].get("MemTotal", 0)))
        if not args.sim and result["meminfo_start"].get("MemAvailable", 0) < need:
            result["host_touch"] = touch_host_memory(min(need, int(0.95 * 128 * GiB)), run)
        holders = [holder_step(run, args, args.hold_gib, floor)]
        reason = ((holders[0].get("park") or {}).get("reason") or "")
        if holders[0].get("park", {}).get("exit") and "host memory" in reason:
            avail = meminfo().get("MemAvailable", 0)
            fits = int((avail - max(8 * GiB, int(0.1 * meminfo().get("MemTotal", 0))) - 4 * GiB) / GiB)
            run.say(f"the park of {args.hold_gib:g} GiB was refused for host memory ({reason}); again with {fits} GiB")
            if fits >= 8:
                holders.append(holder_step(run, args, float(fits), floor))
        result["holder"] = holders
    result["meminfo_end"] = meminfo()
    save()
    run.say(json.dumps(result, indent=2))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
