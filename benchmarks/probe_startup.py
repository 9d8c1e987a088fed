"""Where a GPU tool's first milliseconds go on this machine, and what a kill costs the driver.

    python3 benchmarks/probe_startup.py --out DIR [--runs 15] [--gib 60] [--i-own-this-machine]

Part 1 (no GPU memory touched): process start of the interpreter with and
without ``site`` (``-S``) and isolation (``-I``), ``import ctypes``, loading
``libnvidia-ml.so.1`` and ``nvmlInit_v2`` through ctypes, the Python floor
(``import pynvml; nvmlInit()``), and ``nvidia-smi --query-compute-apps``, each
as a fresh process, medians of ``--runs``; ``-X importtime`` of a bare
interpreter; the ``.pth`` files ``site`` runs; in-process timings of each NVML
call (handles taken one after another and on one thread per GPU).

Part 2 (only with ``--i-own-this-machine``; holders started by this script):
SIGKILL to a holder of ``--gib`` GiB on every GPU, then three instants watched
from a process with NVML already open: the holder's exit (its pidfd becomes
readable), its pid gone from the compute list, and the memory back under 64 MiB.

Writes ``probe-startup.json`` and ``probe-startup.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _gpuhold import GiB, Holders, exit_on_sigterm, visible_gpus

PY = sys.executable
NVML_CTYPES = "import ctypes; l = ctypes.CDLL('libnvidia-ml.so.1'); assert l.nvmlInit_v2() == 0"

INPROC = r"""
import ctypes, json, sys, threading, time
T = time.perf_counter
out = {}
t = T(); l = ctypes.CDLL("libnvidia-ml.so.1"); out["dlopen"] = T() - t
t = T(); rc = l.nvmlInit_v2(); out["nvmlInit_v2"] = T() - t
n = ctypes.c_uint(); t = T(); l.nvmlDeviceGetCount_v2(ctypes.byref(n)); out["count"] = T() - t
n = n.value
parallel = sys.argv[1] == "threads"
hs = [ctypes.c_void_p() for _ in range(n)]
per = [0.0] * n
def handle(i):
    t = T(); l.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(hs[i])); per[i] = T() - t
t = T()
if parallel:
    th = [threading.Thread(target=handle, args=(i,)) for i in range(n)]
    [x.start() for x in th]; [x.join() for x in th]
else:
    [handle(i) for i in range(n)]
out["handles_total"] = T() - t; out["handle_each"] = per
class Mem(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong), ("reserved", ctypes.c_ulonglong),
                ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]
m = Mem(); m.version = ctypes.sizeof(Mem) | (2 << 24)
t = T(); [l.nvmlDeviceGetMemoryInfo_v2(h, ctypes.byref(m)) for h in hs]; out["memory_v2_all"] = T() - t
class P(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong), ("gi", ctypes.c_uint), ("ci", ctypes.c_uint)]
buf = (P * 64)(); cnt = ctypes.c_uint(64)
t = T()
for h in hs:
    cnt.value = 64; l.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(cnt), buf)
out["compute_procs_all"] = T() - t
u = (ctypes.c_uint * 2)(); t = T(); [l.nvmlDeviceGetUtilizationRates(h, u) for h in hs]; out["util_all"] = T() - t
p = ctypes.c_uint(); t = T(); [l.nvmlDeviceGetPowerUsage(h, ctypes.byref(p)) for h in hs]; out["power_all"] = T() - t
tt = ctypes.c_uint(); t = T(); [l.nvmlDeviceGetTemperature(h, 0, ctypes.byref(tt)) for h in hs]; out["temp_all"] = T() - t
t = T(); l.nvmlShutdown(); out["shutdown"] = T() - t
print(json.dumps(out))
"""

WATCH = r"""
import ctypes, json, os, select, sys, time
T = time.perf_counter
l = ctypes.CDLL("libnvidia-ml.so.1"); assert l.nvmlInit_v2() == 0
n = ctypes.c_uint(); l.nvmlDeviceGetCount_v2(ctypes.byref(n))
hs = [ctypes.c_void_p() for _ in range(n.value)]
for i, h in enumerate(hs): l.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h))
class Mem(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong), ("reserved", ctypes.c_ulonglong),
                ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]
class P(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong), ("gi", ctypes.c_uint), ("ci", ctypes.c_uint)]
m = Mem(); m.version = ctypes.sizeof(Mem) | (2 << 24); buf = (P * 64)(); cnt = ctypes.c_uint()
def used():
    s = 0
    for h in hs: l.nvmlDeviceGetMemoryInfo_v2(h, ctypes.byref(m)); s = max(s, m.used)
    return s
def listed():
    k = 0
    for h in hs:
        cnt.value = 64; l.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(cnt), buf); k += cnt.value
    return k
pids = [int(x) for x in sys.argv[1:]]
fds = {os.pidfd_open(p): p for p in pids}
sig = sys.stdin.readline()  # "SIGKILL" or "SIGTERM"
t0 = T()
for p in pids: os.kill(p, getattr(__import__("signal"), sig.strip()))
ev = {"signal": sig.strip()}
pl = select.poll(); [pl.register(fd, select.POLLIN) for fd in fds]
left = set(fds)
while left or "gone" not in ev or "free" not in ev:
    for fd, _ in pl.poll(0):
        pl.unregister(fd); left.discard(fd); ev.setdefault("exit_first", T() - t0)
        if not left: ev["exit_all"] = T() - t0
    if "gone" not in ev and listed() == 0: ev["gone"] = T() - t0
    if "free" not in ev and used() <= 64 * 2**20: ev["free"] = T() - t0
    if T() - t0 > 30: ev["timeout"] = True; break
print(json.dumps(ev))
"""


def timed(cmd: list[str], runs: int, env: dict[str, str] | None = None) -> dict[str, float]:
    ms = []
    for _ in range(runs):
        t = time.perf_counter()
        p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        ms.append((time.perf_counter() - t) * 1e3)
        if p.returncode != 0:
            return {"error": p.stderr.decode(errors="replace")[-300:]}
    ms.sort()
    return {"median_ms": round(statistics.median(ms), 1), "min_ms": round(ms[0], 1), "max_ms": round(ms[-1], 1)}


def pth_files() -> list[dict[str, str]]:
    import site
    out = []
    for d in site.getsitepackages() + [site.getusersitepackages()]:
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        for name in names:
            if name.endswith(".pth"):
                try:
                    text = Path(d, name).read_text(errors="replace")
                except OSError:
                    text = "?"
                out.append({"file": os.path.join(d, name), "imports": " | ".join(
                    x.strip()[:120] for x in text.splitlines() if x.startswith(("import", "import\t")))})
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--gib", type=float, default=60)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--i-own-this-machine", action="store_true")
    a = ap.parse_args()
    exit_on_sigterm()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res: dict[str, object] = {"machine": platform.node(), "python": sys.version.split()[0], "executable": PY,
                              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    cmds = {
        "/bin/true": ["/bin/true"],
        "python -I -S -c pass": [PY, "-I", "-S", "-c", "pass"],
        "python -S -c pass": [PY, "-S", "-c", "pass"],
        "python -I -c pass": [PY, "-I", "-c", "pass"],
        "python -c pass": [PY, "-c", "pass"],
        "python -I -S: import ctypes": [PY, "-I", "-S", "-c", "import ctypes"],
        "python -I -S: ctypes nvmlInit_v2": [PY, "-I", "-S", "-c", NVML_CTYPES],
        "python: ctypes nvmlInit_v2": [PY, "-c", NVML_CTYPES],
        "python: import pynvml (floor without init)": [PY, "-c", "import pynvml"],
        "python: import pynvml; nvmlInit() (floor)": [PY, "-c", "import pynvml; pynvml.nvmlInit()"],
        "nvidia-smi --query-compute-apps": ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
    }
    res["startup"] = {k: timed(v, a.runs) for k, v in cmds.items()}
    res["importtime_bare"] = subprocess.run([PY, "-X", "importtime", "-c", "pass"], capture_output=True,
                                            text=True).stderr[-6000:]
    res["pth"] = pth_files()
    res["persistence"] = subprocess.run(["nvidia-smi", "--query-gpu=index,persistence_mode,name", "--format=csv,noheader"],
                                        capture_output=True, text=True).stdout
    res["inproc"] = {mode: [json.loads(subprocess.run([PY, "-c", INPROC, mode], capture_output=True, text=True,
                                                      check=True).stdout) for _ in range(5)]
                     for mode in ("sequential", "threads")}
    if a.i_own_this_machine:
        n = visible_gpus()
        holders = Holders()
        teardown = []
        try:
            for ngpu in sorted({1, n}):
                for sig in ("SIGKILL", "SIGTERM"):
                    for _ in range(a.reps):
                        jobs = holders.each(ngpu, int(a.gib * GiB))
                        pids = [j.leader for j in jobs]
                        w = subprocess.Popen([PY, "-c", WATCH, *map(str, pids)], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, text=True)
                        time.sleep(1.0)  # NVML opened in the watcher
                        w.stdin.write(sig + "\n"); w.stdin.flush()  # type: ignore[union-attr]
                        ev = json.loads(w.communicate(timeout=60)[0])
                        ev["gpus"] = ngpu
                        teardown.append(ev)
                        holders.kill()
                        print(json.dumps(ev), flush=True)
        finally:
            holders.close()
        res["teardown"] = teardown
    (out / "probe-startup.json").write_text(json.dumps(res, indent=1))
    lines = [f"- {res['machine']}, Python {res['python']} ({PY}), {res['date']}", "",
             "| command | median ms | min | max |", "| --- | ---: | ---: | ---: |"]
    for k, v in res["startup"].items():  # type: ignore[union-attr]
        lines.append(f"| {k} | {v.get('median_ms', v.get('error'))} | {v.get('min_ms', '')} | {v.get('max_ms', '')} |")
    (out / "probe-startup.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(json.dumps({k: res[k] for k in ("inproc", "pth", "persistence")}, indent=0)[:6000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
