"""Where the wall-clock time of one `gpuslate clear` (and of `status`) goes, phase by phase.

    python3 benchmarks/profile_clear.py [--runs 3] [--gib 60] [--tree] [--status] [--out DIR]
    python3 benchmarks/profile_clear.py --sim [--gpus 2] ...     # no GPU: a simulated host

Each run starts fresh holders (one torch process per visible GPU holding
``--gib`` GiB; with ``--tree``, a launcher and 8 workers spread over the GPUs),
then runs `clear --pid ... --json` in a fresh interpreter that is the real CLI
with timing wrappers around its phases and around every NVML call:

    interpreter start   spawn -> first line of the probe (fork, exec, site)
    imports             gpuslate's NVML binding (ctypes), its CLI, the clear modules
    nvml init           open_backend (nvmlInit; on a simulated host, reading host.json)
    lock                the host lock
    plan                make_plan: NVML reads (full), the /proc fd scan, the process table, the rules
    signals             SIGTERM to every target until every target has exited
    verify              the poll loop until every GPU is free (number of polls, NVML time)
    output + exit       JSON document, flush, process exit as the parent sees it

It prints a median table and, per NVML function, the calls and their time
(which calls grow with the GPU count). With ``--status``, `status --json` and
the table are profiled the same way. Everything (JSON + log) goes to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
from _gpuhold import GiB, Holders, exit_on_sigterm, wait_all_free  # noqa: E402

# The probe: the real CLI (cli.main.main) with wrappers. Reports on fd 3 as JSON.
PROBE = r"""
import time; T0 = time.time(); P0 = time.perf_counter()
import json, os, sys, threading
marks = {"first_line_epoch": T0}
spans = []          # (name, start_ms, end_ms) relative to P0
nv_calls = {}       # NVML function -> [count, total_ms, max_ms, first_ms]
lock = threading.Lock()
def now(): return (time.perf_counter() - P0) * 1000
def wrap(owner, attr, name):
    fn = getattr(owner, attr)
    def w(*a, **k):
        s = now()
        try: return fn(*a, **k)
        finally:
            with lock: spans.append((name, s, now()))
    setattr(owner, attr, w)
s = now()
import gpuslate.gpu.libnvml as libnvml  # gpuslate's ctypes binding: every NVML call goes through Nvml
def mk(f, n):
    def w(*a, **k):
        s = time.perf_counter()
        try: return f(*a, **k)
        finally:
            d = (time.perf_counter() - s) * 1000
            with lock:
                c = nv_calls.setdefault(n, [0, 0.0, 0.0, d]); c[0] += 1; c[1] += d; c[2] = max(c[2], d)
    return w
for n, f in list(vars(libnvml.Nvml).items()):
    if callable(f) and not n.startswith("_"):
        setattr(libnvml.Nvml, n, mk(f, f"Nvml.{n}"))
spans.append(("import NVML binding (ctypes)", s, now()))
if os.environ.get("GPUSLATE_SIM"):  # the simulator's own modules, apart from gpuslate's (a real host has none)
    s = now()
    import gpuslate.gpu.simhost
    spans.append(("import the simulated host (simulator)", s, now()))
s = now()
import gpuslate.cli.main as cm
cmd = sys.argv[1]
if cmd == "clear":
    import gpuslate.cli.commands.clear, gpuslate.clearing.clear as sc, gpuslate.clearing.plan
else:
    import gpuslate.cli.commands.status, gpuslate.host.snapshot
    if "--json" not in sys.argv: import gpuslate.cli.render.status
spans.append(("import gpuslate", s, now()))
import gpuslate.gpu as g, gpuslate.host.snapshot as snapmod, gpuslate.cli.commands.common as common
wrap(snapmod, "scan_device_holders", "fd scan")
wrap(snapmod, "take_snapshot", "snapshot")
wrap(snapmod, "ProcTable", "process table")
if cmd == "clear":
    import gpuslate.host.lock as lk, gpuslate.clearing.plan as pl
    wrap(lk.HostLock, "acquire", "lock")
    wrap(sc, "make_plan", "plan")
    wrap(pl, "take_snapshot", "snapshot")
    wrap(pl, "ProcTable", "process table")
    wrap(sc, "terminate", "signals (until every target exited)")
    wrap(sc, "_verify", "verify (poll until free)")
if os.environ.get("GPUSLATE_SIM"):  # the simulated driver's owner lookup: one read of /proc/locks a survey
    import gpuslate.gpu.simhost.records as simrec, gpuslate.gpu.simhost.host as simhost
    wrap(simrec, "lock_owners", "simulator: /proc/locks (holders' owners)")
    simhost.lock_owners = simrec.lock_owners
orig_open = g.open_backend
def open_and_wrap(*a, **k):
    s = now()
    be = orig_open(*a, **k)
    with lock: spans.append(("nvml init (open_backend)", s, now()))
    read = be.read
    def r(indices=None, *, full=True):
        s = now()
        try: return read(indices, full=full)
        finally:
            with lock: spans.append(("backend.read(full)" if full else "backend.read(memory+processes)", s, now()))
    be.read = r
    return be
import gpuslate.host.session as hs  # status and clear open their backend through the Host
g.open_backend = common.open_backend = hs.open_backend = open_and_wrap
import io
buf = io.StringIO(); real = sys.stdout; sys.stdout = buf
s = now()
try:
    import gpuslate.cli as boot  # as the console script does: the driver starts first
    early = boot.early_command(sys.argv[1:])
    if early:
        from gpuslate.gpu.nvml import start_early_init
        start_early_init(prefetch=early == "status")
    rc = cm.main(sys.argv[1:])
finally:
    sys.stdout = real
spans.append(("command (main)", s, now()))
s = now(); real.write(buf.getvalue()); real.flush(); spans.append(("write output", s, now()))
os.write(int(os.environ["PROBE_FD"]), json.dumps({"rc": rc, "marks": marks, "spans": spans, "nvml": nv_calls,
                        "threads_alive": threading.active_count()}).encode())
os._exit(rc)
"""

def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def visible_gpus() -> int:
    out = subprocess.run([sys.executable, "-c", "import pynvml; pynvml.nvmlInit(); print(pynvml.nvmlDeviceGetCount())"],
                         capture_output=True, text=True)
    return int(out.stdout) if out.returncode == 0 else 0


class SimJobs:
    """Holders on the simulated host: `gpuslate sim hold` process trees, each its own session."""

    def __init__(self, sim: str, env: dict[str, str]) -> None:
        self.sim, self.env = sim, env
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, ngpu: int, gib: float, tree: bool) -> list[int]:
        args = [["sim", "hold", "--gpus", f"0-{ngpu - 1}", "--memory", f"{gib}GiB", "--workers", "8"]] if tree else \
            [["sim", "hold", "--gpus", str(i), "--memory", f"{gib}GiB"] for i in range(ngpu)]
        procs = [subprocess.Popen([sys.executable, "-m", "gpuslate", "--sim", self.sim, *x],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, env=self.env,
                                  start_new_session=True) for x in args]
        self.procs += procs
        for p in procs:
            r, _, _ = select.select([p.stdout], [], [], 60)
            if not r or not p.stdout.readline():  # type: ignore[union-attr]
                raise RuntimeError("simulated holder did not become ready")
        return [p.pid for p in procs]

    def kill(self) -> None:
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        self.procs = []

    def close(self) -> None:
        self.kill()


class GpuJobs:
    """Torch holders from the benchmarks' fork server (_gpuhold.py)."""

    def __init__(self) -> None:
        self.h = Holders()

    def start(self, ngpu: int, gib: float, tree: bool) -> list[int]:
        jobs = [self.h.tree(8, int(gib * GiB), ngpu)] if tree else self.h.each(ngpu, int(gib * GiB))
        return [j.leader for j in jobs]

    def kill(self) -> None:
        self.h.kill()
        wait_all_free()

    def close(self) -> None:
        self.h.close()


def probe(args: list[str], env: dict[str, str]) -> dict:
    """Run the probe; return its report plus the wall time the parent saw."""
    r, w = os.pipe()
    t_spawn = time.time()
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-c", PROBE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env={**env, "PROBE_FD": str(w)}, pass_fds=(w,))
    os.close(w)
    out, err = p.communicate(timeout=300)
    wall = (time.perf_counter() - t0) * 1000
    data = b""
    while chunk := os.read(r, 1 << 16):
        data += chunk
    os.close(r)
    if not data:
        raise RuntimeError(f"probe failed ({p.returncode}): {err.decode()[-800:]}")
    rep = json.loads(data)
    rep["wall_ms"] = wall
    rep["interpreter_start_ms"] = (rep["marks"]["first_line_epoch"] - t_spawn) * 1000
    rep["stdout"] = out.decode()
    rep["stderr"] = err.decode()
    return rep


def phases(rep: dict) -> dict[str, float]:
    """Sum of span durations per name (first-level phases) plus the derived ones."""
    tot: dict[str, float] = {}
    count: dict[str, int] = {}
    for name, s, e in rep["spans"]:
        tot[name] = tot.get(name, 0.0) + (e - s)
        count[name] = count.get(name, 0) + 1
    out = {"wall (parent: spawn to exit)": rep["wall_ms"], "interpreter start": rep["interpreter_start_ms"]}
    out.update(tot)
    end = max(e for _, _, e in rep["spans"])
    out["exit (after output, as the parent sees it)"] = rep["wall_ms"] - rep["interpreter_start_ms"] - end
    for k in ("backend.read(memory+processes)", "backend.read(full)"):
        if k in count:
            out[f"{k}: calls"] = count[k]
    return out


def table(rows: list[dict[str, float]], title: str) -> str:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    lines = [f"### {title} (median of {len(rows)} runs; ms)", "", "| phase | median | min | max |",
             "| --- | ---: | ---: | ---: |"]
    for k in keys:
        v = [r[k] for r in rows if k in r]
        lines.append(f"| {k} | {statistics.median(v):.1f} | {min(v):.1f} | {max(v):.1f} |")
    return "\n".join(lines)


def nvml_table(reps: list[dict], title: str) -> str:
    agg: dict[str, list[float]] = {}
    for rep in reps:
        for n, (c, t, mx, first) in rep["nvml"].items():
            a = agg.setdefault(n, [0, 0.0, 0.0, 0.0])
            a[0] += c
            a[1] += t
            a[2] = max(a[2], mx)
            a[3] += first
    k = max(1, len(reps))
    lines = [f"### NVML calls per run: {title}", "", "| function | calls | total ms | first call ms | max ms |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for n, (c, t, mx, first) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"| {n} | {c / k:.0f} | {t / k:.2f} | {first / k:.2f} | {mx:.2f} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--gib", type=float, default=None, help="GiB per holder (default 60; 15 with --tree)")
    ap.add_argument("--tree", action="store_true", help="a launcher + 8 workers spread over the GPUs")
    ap.add_argument("--status", action="store_true", help="also profile `status --json` and the table")
    ap.add_argument("--sim", action="store_true", help="a simulated host in a temporary folder (no GPU needed)")
    ap.add_argument("--gpus", type=int, default=2, help="with --sim: simulated GPUs (default 2)")
    ap.add_argument("--out", type=Path, help="folder for profile-clear.json and profile-clear.md")
    a = ap.parse_args()
    exit_on_sigterm()
    gib = a.gib if a.gib is not None else (15.0 if a.tree else 60.0)
    env = {k: v for k, v in os.environ.items() if k != "GPUSLATE_SIM"}
    src = str(ROOT / "src")
    if not any(Path(p, "gpuslate").is_dir() for p in env.get("PYTHONPATH", "").split(os.pathsep) if p):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    tmp = Path(tempfile.mkdtemp(prefix="gpuslate-profile-"))
    env["GPUSLATE_STATE_DIR"] = str(tmp / "state")
    env["GPUSLATE_LOCK_DIR"] = str(tmp / "locks")
    sim = None
    ngpu = 0 if a.sim else visible_gpus()
    if ngpu == 0:
        ngpu = a.gpus
        sim = str(tmp / "host")
        subprocess.run([sys.executable, "-m", "gpuslate", "sim", "init", sim, "--gpus", str(ngpu), "--memory",
                        f"{max(96, int(gib) * 2)}GiB", "--release-delay", "0.2"], env=env, check=True,
                       capture_output=True)
        env["GPUSLATE_SIM"] = sim
        log(f"no GPU (or --sim): simulated host with {ngpu} GPUs in {sim}")
    if not sim:  # an idle GPU without persistence mode is initialised by the first query that touches it
        q = subprocess.run(["nvidia-smi", "--query-gpu=index,name,persistence_mode,pstate", "--format=csv,noheader"],
                           capture_output=True, text=True)
        log("GPUs (index, name, persistence mode, P-state): " + "; ".join(q.stdout.strip().splitlines()))
    workload = f"launcher + 8 workers x {gib:g} GiB over {ngpu} GPUs" if a.tree else \
        f"{ngpu} x {gib:g} GiB, one process per GPU"
    log(f"profiling clear: {workload}, {a.runs} runs")
    reps: list[dict] = []
    jobs = SimJobs(sim, env) if sim else GpuJobs()
    for i in range(a.runs):
        leaders = jobs.start(ngpu, gib, a.tree)
        try:
            pids = [str(p) for p in leaders]
            args = ["clear", "--gpus", ",".join(map(str, range(ngpu))), "--json", "--yes"]
            for pid in pids:
                args += ["--pid", pid]
            rep = probe(args, env)
            doc = json.loads(rep["stdout"])
            rep["clear_status"] = doc["status"]
            rep["clear_timings"] = doc["timings"]
            log(f"run {i + 1}: {doc['status']} in {rep['wall_ms']:.0f} ms wall; clear's own timings {doc['timings']}")
            reps.append(rep)
        finally:
            jobs.kill()
    out = [f"Machine: {os.uname().nodename}, {ngpu} {'simulated ' if sim else ''}GPUs, Python "
           f"{sys.version.split()[0]}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
           f"Command: python3 benchmarks/profile_clear.py {' '.join(sys.argv[1:])}", "",
           table([phases(r) for r in reps], f"clear, {workload}"), "", nvml_table(reps, "clear")]
    status_reps: dict[str, list[dict]] = {}
    if a.status:
        jobs.start(ngpu, min(gib, 8.0), False)
        try:
            for label, args in (("status --json", ["status", "--json"]), ("status (table)", ["status"])):
                status_reps[label] = [probe(args, env) for _ in range(max(5, a.runs))]
                out += ["", table([phases(r) for r in status_reps[label]], label), "",
                        nvml_table(status_reps[label], label)]
        finally:
            jobs.kill()
    jobs.close()
    text = "\n".join(out)
    print(text)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "profile-clear.md").write_text(text + "\n")
        for r in [*reps, *(x for v in status_reps.values() for x in v)]:
            r.pop("stdout", None)
        (a.out / "profile-clear.json").write_text(json.dumps({"workload": workload, "sim": bool(sim), "clear": reps,
                                                              "status": status_reps}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
