"""`gpuslate clear` end to end against the anchors, on every visible GPU, both workloads in one run.

    python3 benchmarks/bench_clear.py --out DIR [--reps 3] [--script /path/to/gpuslate] [--i-own-this-machine]
    python3 benchmarks/bench_clear.py --out DIR --sim 1 [--reps 20] [--before OLD_TREE]   # no GPU

Workloads (fresh holders for every measurement; torch processes allocating
with ``torch.empty(..., device=f"cuda:{i}")``, see ``_gpuhold.py``):

* ``one-per-gpu``: one process per visible GPU holding ``--gib`` (60) GiB each;
* ``tree``: a launcher and 8 workers x ``--tree-gib`` (15) GiB spread over the GPUs.

Methods, side by side in every repetition:

* ``gpuslate``: ``gpuslate clear --json`` (the console script given by
  ``--script``, as users run it), from process start to its verified-free exit;
* ``careful``: ``kill $(nvidia-smi --query-compute-apps=pid --format=csv,noheader)``,
  then the same query every 0.1 s until it lists nothing (it leaves the tree's
  launcher alive, and would kill every user's jobs);
* ``seed``: ``fuser -k /dev/nvidia*; sleep 2; nvidia-smi | grep MiB | head -4``.
  It kills every process holding a GPU device file, so it runs only with
  ``--i-own-this-machine`` and only when every such process is one this script
  started; when another process holds one, or fuser is ``unavailable``, the
  same line limited to this script's pids (``kill -9 PIDS; sleep 2; ...``) is
  timed instead and marked so;
* ``teardown``: SIGKILL to the holders, then a tight NVML loop until every GPU is
  free: the driver's own time, the floor of any tool;
* the Python floor, ``python3 -c "import pynvml; pynvml.nvmlInit()"``, timed
  ``--floor-runs`` times in the same run.

After every method an independent NVML check (a separate process) says whether
the GPUs really were free when the method said so. Everything goes to ``--out``:
``bench-clear.json`` (every run), ``bench-clear.md`` (tables ready to paste).

With ``--sim N`` it runs without a GPU (``_simhost.py``): one ``sim hold`` process per simulated GPU,
cleared by ``gpuslate clear --json --yes`` (this tree, and ``--before DIR``'s in the same rounds, in
turns), ``python -c pass`` timed in every round as the floor. The simulated driver releases a dead
holder's memory ``--release-delay`` seconds after it first sees it dead (a teardown, as a real
driver's); what gpuslate itself costs is the clear's wall time less the floor and that delay.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _gpuhold import (
    GiB,
    Holders,
    descends_from,
    device_holders,
    exit_on_sigterm,
    gpu_usage,
    visible_gpus,
    wait_all_free,
)
from _simhost import SimHost
from _timing import interpreter_of

ROOT = Path(__file__).resolve().parents[1]
FREE = 64 * 2**20
CAREFUL = ("kill $(nvidia-smi --query-compute-apps=pid --format=csv,noheader); "
           "while [ -n \"$(nvidia-smi --query-compute-apps=pid --format=csv,noheader)\" ]; do sleep 0.1; done")
SEED = "fuser -k /dev/nvidia* 2>/dev/null; sleep 2; nvidia-smi | grep MiB | head -4"
FLOOR = [sys.executable, "-c", "import pynvml; pynvml.nvmlInit()"]
# NVML initialised first (not timed); then SIGKILL and spin until every GPU is free; prints seconds.
TEARDOWN = r"""
import os, sys, time, pynvml
pynvml.nvmlInit()
hs = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
pids = [int(p) for p in sys.argv[1:]]
t0 = time.perf_counter()
for p in pids:
    try: os.kill(p, 9)
    except ProcessLookupError: pass
pending = list(hs)
while pending:
    pending = [h for h in pending if pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).used > 64 * 2**20
               or pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
print(time.perf_counter() - t0)
"""

# Started before the careful script: NVML initialised, then on "go" it spins until every GPU is
# free and prints the epoch of that moment (the script itself only sees its process list empty).
WATCH = r"""
import sys, time, pynvml
pynvml.nvmlInit()
hs = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
print("ready", flush=True); sys.stdin.readline()
pending = list(hs)
deadline = time.monotonic() + 60
while pending and time.monotonic() < deadline:
    pending = [h for h in pending if pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).used > 64 * 2**20
               or pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
    time.sleep(0.001)
print(time.time() if not pending else "timeout", flush=True)
"""

LOG: list[str] = []


def log(msg: str) -> None:
    line = f"[{time.strftime('%H:%M:%S', time.gmtime())}Z] {msg}"
    LOG.append(line)
    print(line, flush=True)


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    return time.perf_counter() - t0, p


def start_workload(h: Holders, workload: str, ngpu: int, gib: float, tree_gib: float) -> list[int]:
    """Start the workload's jobs; return every pid they consist of."""
    if workload == "one-per-gpu":
        jobs = h.each(ngpu, int(gib * GiB))
    else:
        jobs = [h.tree(8, int(tree_gib * GiB), ngpu)]
    return [p for j in jobs for p in j.pids]


def seed_allowed(h: Holders, ours: list[int], own_machine: bool) -> str | None:
    """Why the seed line may not run now (None: it may)."""
    if not own_machine:
        return "skipped: needs --i-own-this-machine (it kills every process holding /dev/nvidia*)"
    if shutil.which("fuser") is None:
        return "unavailable: fuser (psmisc) is not installed"
    roots = set(ours) | h.server_pids()
    strangers = [p for p in device_holders() if p != os.getpid() and not descends_from(p, roots)]
    if strangers:
        return f"skipped: processes this script did not start hold /dev/nvidia*: {sorted(strangers)[:10]}"
    if h.server_pids() & set(device_holders()):
        return "skipped: the fork server holds /dev/nvidia* (fuser -k would kill it)"
    return None


def measure(method: str, h: Holders, pids: list[int], gs: list[str], env: dict[str, str],
            own_machine: bool) -> dict:
    rec: dict = {"method": method}
    if method in ("gpuslate", "gpuslate-isolated"):
        s, p = timed([*gs, "clear", "--json"], env)
        rec["seconds"] = s
        rec["exit_code"] = p.returncode
        try:
            doc = json.loads(p.stdout)
            rec.update(status=doc.get("status"), timings=doc.get("timings"),
                       targets=len(doc.get("targets", [])), spared=len(doc.get("spared", [])))
        except json.JSONDecodeError:
            rec["error"] = p.stderr[-500:]
    elif method == "careful":
        w = subprocess.Popen([sys.executable, "-c", WATCH], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env=env)
        assert w.stdout is not None and w.stdin is not None
        if w.stdout.readline().strip() != "ready":
            raise RuntimeError("the NVML watcher did not start")
        t_epoch = time.time()
        w.stdin.write("go\n")
        w.stdin.flush()
        s, p = timed(["bash", "-c", CAREFUL])
        rec["seconds"], rec["exit_code"] = s, p.returncode
        freed = w.communicate(timeout=90)[0].strip()
        # when the memory was really free, after the script's start (it may exit before)
        rec["memory_free_s"] = float(freed) - t_epoch if freed not in ("", "timeout") else None
        rec["left_alive"] = [q for q in pids if os.path.exists(f"/proc/{q}") and _state(q) not in ("Z", "X")]
    elif method == "seed":
        why = seed_allowed(h, pids, own_machine)
        if why and not own_machine:
            rec["skipped"] = why
            return rec
        cmd = SEED
        if why:  # fuser missing, or others hold the GPUs: the same line, limited to our processes
            rec["skipped"] = why
            rec["variant"] = "stand-in: kill -9 OUR_PIDS; sleep 2; nvidia-smi | grep MiB | head -4"
            cmd = f"kill -9 {' '.join(map(str, pids))}; sleep 2; nvidia-smi | grep MiB | head -4"
        s, p = timed(["bash", "-c", cmd])
        rec["seconds"], rec["output"] = s, p.stdout.strip()
    elif method == "teardown":
        s, p = timed([sys.executable, "-c", TEARDOWN, *map(str, pids)], env)
        if p.returncode != 0:
            rec["error"] = p.stderr[-500:]
        else:
            rec["seconds"] = float(p.stdout)
    usage = gpu_usage()
    rec["after"] = usage
    rec["verified_free_after"] = all(u <= FREE and n == 0 for u, n in usage)
    return rec


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for bench-clear.json, .md and .log")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--gib", type=float, default=60, help="GiB per process in one-per-gpu (default 60)")
    ap.add_argument("--tree-gib", type=float, default=15, help="GiB per worker in tree (default 15)")
    ap.add_argument("--floor-runs", type=int, default=10)
    ap.add_argument("--script", help="the installed `gpuslate` console script (default: python -m gpuslate from src)")
    ap.add_argument("--isolated-script",
                    help="also time this console script: gpuslate installed in a venv of its own, as pipx installs "
                         "it (method gpuslate-isolated); its interpreter also times the floor, as 'isolated floor'")
    ap.add_argument("--workloads", default="one-per-gpu,tree")
    ap.add_argument("--methods", default="gpuslate,careful,seed,teardown")
    ap.add_argument("--i-own-this-machine", action="store_true",
                    help="allow the seed line (fuser -k /dev/nvidia*) when only this script's processes hold GPUs")
    ap.add_argument("--no-forkserver", action="store_true", help="start every holder as a fresh python process")
    ap.add_argument("--sim", type=int, metavar="GPUS", help="no GPU: a simulated host of GPUS GPUs (see above)")
    ap.add_argument("--before", metavar="DIR", help="with --sim: also time the gpuslate source tree in DIR")
    ap.add_argument("--release-delay", type=float, default=0.2, help="with --sim: the simulated teardown (s)")
    a = ap.parse_args()
    exit_on_sigterm()
    a.out.mkdir(parents=True, exist_ok=True)
    if a.sim:
        return sim_main(a)
    t_start = time.monotonic()
    env = {k: v for k, v in os.environ.items() if k != "GPUSLATE_SIM"}
    tmp = Path(tempfile.mkdtemp(prefix="bench-clear-"))
    env.update(GPUSLATE_STATE_DIR=str(tmp / "state"), GPUSLATE_LOCK_DIR=str(tmp / "locks"))
    if not a.script:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)
    gs = [a.script] if a.script else [sys.executable, "-m", "gpuslate"]
    ngpu = visible_gpus()
    if not wait_all_free(timeout=10):
        log(f"GPUs not free at the start: {gpu_usage()}; refusing to measure")
        return 4
    log(f"{ngpu} GPUs, gpuslate = {' '.join(gs)}, reps {a.reps}")
    # Python floor, and gpuslate's start-up warm (bytecode cache, page cache)
    for _ in range(2):
        subprocess.run([*gs, "clear", "--dry-run", "--json"], capture_output=True, env=env)
    iso = [a.isolated_script] if a.isolated_script else None
    iso_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}  # the venv's own packages only
    iso_floor_cmd = [interpreter_of(a.isolated_script), *FLOOR[1:]] if a.isolated_script else None
    if iso:
        for _ in range(2):
            subprocess.run([*iso, "clear", "--dry-run", "--json"], capture_output=True, env=iso_env)
    floor = [timed(FLOOR, env)[0] for _ in range(a.floor_runs)]
    iso_floor = [timed(iso_floor_cmd, iso_env)[0] for _ in range(a.floor_runs)] if iso_floor_cmd else []
    log(f"python floor: median {ms(median(floor))} ms of {len(floor)}"
        + (f"; in the isolated venv: {ms(median(iso_floor))} ms" if iso_floor else ""))
    h = Holders(use_forkserver=not a.no_forkserver)
    log("fork server: " + ("up" if h.server else "not used (fresh python processes)"))
    runs: list[dict] = []
    methods = a.methods.split(",") + (["gpuslate-isolated"] if iso else [])
    try:
        for rep in range(a.reps):
            for workload in a.workloads.split(","):
                for i, method in enumerate(methods[rep % len(methods):] + methods[:rep % len(methods)]):
                    t0 = time.monotonic()
                    pids = start_workload(h, workload, ngpu, a.gib, a.tree_gib)
                    setup = time.monotonic() - t0
                    try:
                        isolated = method == "gpuslate-isolated"
                        rec = measure(method, h, pids, iso if isolated else gs, iso_env if isolated else env,
                                      a.i_own_this_machine)
                    finally:
                        h.kill()
                        if not wait_all_free():
                            log(f"GPUs not free 60 s after the holders were killed: {gpu_usage()}")
                    rec.update(rep=rep, workload=workload, setup_s=round(setup, 2))
                    runs.append(rec)
                    log(json.dumps({k: v for k, v in rec.items() if k not in ("output", "after")}))
        floor += [timed(FLOOR, env)[0] for _ in range(a.floor_runs)]  # and again at the end
        if iso_floor_cmd:
            iso_floor += [timed(iso_floor_cmd, iso_env)[0] for _ in range(a.floor_runs)]
    finally:
        h.close()
    summary = summarize(runs, floor, a, ngpu, iso_floor)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "host": platform.node(), "gpus": ngpu,
            "gpu": _gpu_name(), "python": platform.python_version(), "reps": a.reps,
            "command": "python3 benchmarks/bench_clear.py " + " ".join(sys.argv[1:]),
            "gpuslate_invoked_as": " ".join(gs), "python_floor_ms": [round(x * 1000, 1) for x in floor],
            "isolated_script": a.isolated_script, "isolated_floor_ms": [round(x * 1000, 1) for x in iso_floor],
            "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE"),
            "fuser": shutil.which("fuser"), "wall_s": round(time.monotonic() - t_start, 1)}
    md = markdown(summary, meta)
    print(md)
    (a.out / "bench-clear.json").write_text(json.dumps({"meta": meta, "summary": summary, "runs": runs}, indent=1))
    (a.out / "bench-clear.md").write_text(md + "\n")
    (a.out / "bench-clear.log").write_text("\n".join(LOG) + "\n")
    return 0


def sim_main(a: argparse.Namespace) -> int:
    """``clear`` of one holder per simulated GPU, each tree in turn, ``python -c pass`` in every round."""
    host = SimHost(a.sim, release_delay=a.release_delay, before=a.before)
    labels = list(host.trees)
    walls: dict[str, list[float]] = {label: [] for label in labels}
    floor: list[float] = []
    runs: list[dict] = []
    try:
        for label in labels:  # warm up: bytecode and page cache of each tree
            subprocess.run(host.command("clear", "--dry-run", "--json"), capture_output=True, env=host.trees[label])
        for rep in range(a.reps):
            floor.append(timed([sys.executable, "-c", "pass"], host.env)[0])
            for label in labels[rep % len(labels):] + labels[:rep % len(labels)]:
                for gpu in range(a.sim):
                    host.hold(gpu, a.gib if a.gib <= 8 else 1.0)
                try:
                    s, p = timed(host.command("clear", "--json", "--yes"), host.trees[label])
                finally:
                    host.kill()
                doc = json.loads(p.stdout) if p.stdout.strip() else {}
                if p.returncode != 0 or doc.get("status") != "clean":
                    raise RuntimeError(f"{label}: clear exited {p.returncode}: {p.stderr[-500:]}")
                walls[label].append(s)
                runs.append({"rep": rep, "tree": label, "seconds": s, "timings": doc.get("timings")})
                log(f"{rep} {label}: {s * 1000:.0f} ms {doc.get('timings')}")
    finally:
        host.kill()
    f = median(floor)
    rows = []
    for label in labels:
        w = median(walls[label])
        assert w is not None and f is not None
        rows.append({"tree": label, "clear_ms": round(w * 1000, 1), "python_floor_ms": round(f * 1000, 1),
                     "release_ms": a.release_delay * 1000,
                     "beyond_floor_and_release_ms": round((w - f - a.release_delay) * 1000, 1)})
    lines = ["| tree | clear, median ms | python -c pass | simulated release | beyond floor + release, ms |",
             "| --- | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['tree']} | {r['clear_ms']} | {r['python_floor_ms']} | {r['release_ms']:.0f} | "
              f"**{r['beyond_floor_and_release_ms']}** |" for r in rows]
    if len(rows) == 2:
        lines.append(f"\nafter / before (clear, median): {rows[1]['clear_ms'] / rows[0]['clear_ms']:.3f}; beyond "
                     f"floor + release: {rows[1]['beyond_floor_and_release_ms'] / rows[0]['beyond_floor_and_release_ms']:.3f}")
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "host": platform.node(),
            "simulated_gpus": a.sim, "python": platform.python_version(), "reps": a.reps, "before": a.before,
            "release_delay_s": a.release_delay, "load": os.getloadavg(),
            "command": "python3 benchmarks/bench_clear.py " + " ".join(sys.argv[1:])}
    md = "\n".join([f"- {meta['date']}, {meta['host']}, a simulated host of {a.sim} GPU(s) (one holder each), "
                    f"Python {meta['python']}; {a.reps} rounds, the trees in turns; load average "
                    f"{', '.join(f'{x:.1f}' for x in meta['load'])}.", f"- Command: `{meta['command']}`", "", *lines])
    print(md)
    (a.out / "bench-clear.json").write_text(json.dumps({"meta": meta, "rows": rows, "runs": runs,
                                                       "floor_s": floor}, indent=1))
    (a.out / "bench-clear.md").write_text(md + "\n")
    (a.out / "bench-clear.log").write_text("\n".join(LOG) + "\n")
    return 0


def _gpu_name() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True).stdout.strip().replace("\n", "; ")
    except OSError:
        return "?"


def summarize(runs: list[dict], floor: list[float], a: argparse.Namespace, ngpu: int,
              iso_floor: list[float]) -> list[dict]:
    out = []
    f = median(floor)
    fi = median(iso_floor)
    for workload in a.workloads.split(","):
        def med(method: str) -> float | None:
            return median([r["seconds"] for r in runs if r["workload"] == workload and r["method"] == method
                           and "seconds" in r])

        g, c, s, t = med("gpuslate"), med("careful"), med("seed"), med("teardown")
        cf = median([r["memory_free_s"] for r in runs if r["workload"] == workload and r["method"] == "careful"
                     and r.get("memory_free_s") is not None])
        row: dict = {"workload": workload if workload != "one-per-gpu" else f"{ngpu} x {a.gib:g} GiB, one per GPU",
                     "gpuslate_s": g, "careful_s": c, "careful_memory_free_s": cf, "seed_s": s, "teardown_s": t,
                     "python_floor_s": f}
        if workload == "tree":
            row["workload"] = f"launcher + 8 workers x {a.tree_gib:g} GiB on {ngpu} GPU{'s' if ngpu > 1 else ''}"
        row["careful_over_gpuslate"] = round(c / g, 2) if c and g else None
        row["seed_over_gpuslate"] = round(s / g, 2) if s and g else None
        row["gpuslate_minus_teardown_and_floor_ms"] = round((g - t - f) * 1000, 1) if g and t and f else None
        row["goal_faster_than_careful"] = bool(g and c and g < c)
        row["goal_within_120ms"] = bool(row["gpuslate_minus_teardown_and_floor_ms"] is not None
                                        and row["gpuslate_minus_teardown_and_floor_ms"] <= 120)
        mine = [r for r in runs if r["workload"] == workload]
        row["false_clean"] = {m: sum(1 for r in mine if r["method"] == m and "seconds" in r
                                     and (m != "gpuslate" or r.get("status") == "clean")
                                     and not r["verified_free_after"]) for m in ("gpuslate", "careful", "seed")}
        row["careful_left_alive"] = sorted({len(r.get("left_alive", [])) for r in mine if r["method"] == "careful"})
        row["seed_note"] = next(((r["skipped"] + (f"; timed instead: {r['variant']}" if "variant" in r else ""))
                                 for r in mine if r["method"] == "seed" and "skipped" in r), None)
        row["runs"] = {m: sum(1 for r in mine if r["method"] == m and "seconds" in r) for m in
                       ("gpuslate", "careful", "seed", "teardown", "gpuslate-isolated")}
        gi = med("gpuslate-isolated")
        if gi is not None:
            row.update(gpuslate_isolated_s=gi, isolated_floor_s=fi,
                       careful_over_gpuslate_isolated=round(c / gi, 2) if c else None,
                       gpuslate_isolated_minus_teardown_and_floor_ms=round((gi - t - fi) * 1000, 1) if t and fi else None,
                       goal_isolated_faster_than_careful=bool(c and gi < c),
                       false_clean_isolated=sum(1 for r in mine if r["method"] == "gpuslate-isolated" and "seconds" in r
                                                and r.get("status") == "clean" and not r["verified_free_after"]))
        out.append(row)
    return out


def markdown(summary: list[dict], meta: dict) -> str:
    lines = [f"- Machine: {meta['host']}, {meta['gpus']} x {meta['gpu']}, Python {meta['python']}; "
             f"{meta['date']}; {meta['reps']} repetitions, fresh holders for every measurement.",
             f"- Command: `{meta['command']}`; gpuslate run as `{meta['gpuslate_invoked_as']}`.",
             f"- Python floor (`import pynvml; nvmlInit()`): median "
             f"{ms(median([x / 1000 for x in meta['python_floor_ms']]))} ms of {len(meta['python_floor_ms'])}.", "",
             "| workload | gpuslate ms | careful ms (memory free at) | seed ms | driver teardown ms | "
             "careful ÷ gpuslate | seed ÷ gpuslate | gpuslate − teardown − floor ms | goals (< careful; ≤ 120 ms) | false clean "
             "(gpuslate/careful/seed) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for r in summary:
        fc = r["false_clean"]
        over = r["gpuslate_minus_teardown_and_floor_ms"]
        goals = f"{'yes' if r['goal_faster_than_careful'] else 'NO'}; {'yes' if r['goal_within_120ms'] else 'NO'}"
        lines.append(f"| {r['workload']} | **{ms(r['gpuslate_s'])}** | {ms(r['careful_s'])} "
                     f"({ms(r['careful_memory_free_s'])}) | {ms(r['seed_s'])} | {ms(r['teardown_s'])} | "
                     f"{r['careful_over_gpuslate'] or '-'} | {r['seed_over_gpuslate'] or '-'} | "
                     f"{over if over is not None else '-'} | {goals} | {fc['gpuslate']}/{fc['careful']}/{fc['seed']} |")
    iso = [r for r in summary if r.get("gpuslate_isolated_s") is not None]
    if iso:
        lines += ["", f"gpuslate installed in a venv of its own (`{meta['isolated_script']}`, as `pipx install` "
                  "makes one: no other package's start-up hooks), same repetitions; its Python floor: median "
                  f"{ms(median([x / 1000 for x in meta['isolated_floor_ms']]))} ms.", "",
                  "| workload | gpuslate (own venv) ms | careful ms | careful ÷ gpuslate | "
                  "gpuslate − teardown − floor ms | goal (< careful) | false clean |",
                  "| --- | ---: | ---: | ---: | ---: | --- | ---: |"]
        for r in iso:
            over = r["gpuslate_isolated_minus_teardown_and_floor_ms"]
            lines.append(f"| {r['workload']} | **{ms(r['gpuslate_isolated_s'])}** | {ms(r['careful_s'])} | "
                         f"{r['careful_over_gpuslate_isolated'] or '-'} | {over if over is not None else '-'} | "
                         f"{'yes' if r['goal_isolated_faster_than_careful'] else 'NO'} | {r['false_clean_isolated']} |")
    for r in summary:
        if r["seed_note"]:
            lines.append(f"\nseed, {r['workload']}: {r['seed_note']}")
        if r["careful_left_alive"] and max(r["careful_left_alive"]):
            lines.append(f"\ncareful script, {r['workload']}: left {max(r['careful_left_alive'])} process(es) "
                         "of the job alive (the launcher)")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
