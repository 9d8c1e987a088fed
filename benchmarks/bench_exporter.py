"""`gpuslate exporter`: scrape time, idle CPU and memory over many scrapes; on a GPU host, its
series checked against nvidia-smi.

    python3 benchmarks/bench_exporter.py --out DIR                 # simulated host: 8 GPUs, 200 holders
    python3 benchmarks/bench_exporter.py --out DIR --mode nvml     # the GPUs of this host (NVML)

sim: a simulated host of ``--gpus`` GPUs in a temporary folder, ``--holders`` real holder
processes (``gpuslate sim hold``, 8 jobs of launcher + workers); nothing outside that folder is
touched. nvml: one torch holder per visible GPU and a launcher with ``--workers`` torch workers
(benchmarks/_gpuhold.py), and a monitor (``nvidia-smi -l 1``) beside them; every holder started
here is killed at the end, nothing else is signaled.

Measured, with the exporter as a real process scraped over loopback HTTP:
- scrape time: ``--scrapes`` scrapes back to back, the client's wall time (HTTP included) and the
  exporter's own ``gpuslate_exporter_scrape_duration_seconds``; median, p90, max;
- idle CPU: the exporter's CPU time (utime + stime of all its threads) over ``--idle-seconds``
  with one scrape every ``--interval`` seconds (15 s: Prometheus's default), as % of one core;
- memory: its RSS every 1,000 scrapes over ``--memory-scrapes`` scrapes (a benchmark, not a test);
- nvml only: the process series against ``nvidia-smi --query-compute-apps=pid,used_memory``
  (same pids, same MiB).
Writes ``bench-exporter-MODE.json``, ``.md`` and ``.log`` to ``--out``; exits 1 when a check fails.
prometheus_client must be importable (PYTHONPATH) for the exporter.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _gpuhold import GiB, Holders, exit_on_sigterm, visible_gpus

SRC = str(Path(__file__).resolve().parents[1] / "src")
_SERIES = re.compile(r'^gpuslate_process_memory_bytes\{(.*)\} (\S+)$', re.M)
_INFO = re.compile(r'^gpuslate_process_info\{(.*)\} \S+$', re.M)
_DURATION = re.compile(r"^gpuslate_exporter_scrape_duration_seconds (\S+)$", re.M)
_PID = re.compile(r'(?:^|,)pid="(\d+)"')
_KEY = re.compile(r'(?:^|,)(gpu|unit|user|slot)="((?:[^"\\]|\\.)*)"')


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class Exporter:
    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "gpuslate", "exporter", "--listen", "127.0.0.1:0",
                                      "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=env, start_new_session=True)
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise RuntimeError(f"the exporter did not start: {self.proc.communicate(timeout=10)[1]}")
        self.url = json.loads(line)["metrics_url"]

    def scrape(self) -> tuple[float, str]:
        t0 = time.perf_counter()
        with urllib.request.urlopen(self.url, timeout=30) as r:
            body = r.read().decode()
        return (time.perf_counter() - t0) * 1000, body

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait()


def series_of(body: str) -> dict[int, float]:
    """pid -> bytes summed over GPUs, from gpuslate_process_memory_bytes joined with
    gpuslate_process_info (the pid is in the info series of each memory series' key)."""
    pids = {tuple(_KEY.findall(labels)): int(_PID.search(labels).group(1))  # type: ignore[union-attr]
            for labels in _INFO.findall(body)}
    out: dict[int, float] = {}
    for labels, value in _SERIES.findall(body):
        pid = pids[tuple(_KEY.findall(labels))]
        out[pid] = out.get(pid, 0.0) + float(value)
    return out


def measure(e: Exporter, a: argparse.Namespace, log, expect_series: int | None) -> dict:
    for _ in range(5):
        e.scrape()  # warm-up
    client, server, counts = [], [], []
    for _ in range(a.scrapes):
        ms, body = e.scrape()
        client.append(ms)
        server.append(float(_DURATION.search(body).group(1)) * 1000)  # type: ignore[union-attr]
        counts.append(len(_SERIES.findall(body)))
    res = {"scrapes": a.scrapes, "process_series": counts[-1],
           "client_ms": {"median": statistics.median(client), "p90": pct(client, 90), "max": max(client)},
           "server_ms": {"median": statistics.median(server), "p90": pct(server, 90), "max": max(server)}}
    log(f"scrape: {counts[-1]} process series; client median {res['client_ms']['median']:.1f} ms, p90 "
        f"{res['client_ms']['p90']:.1f}, max {res['client_ms']['max']:.1f}; exporter median "
        f"{res['server_ms']['median']:.1f} ms")
    res["series_ok"] = expect_series is None or all(c == expect_series for c in counts)

    pid = e.proc.pid
    res["idle"] = {"seconds": 0, "interval_s": a.interval, "cpu_pct_of_core": None}
    if a.idle_seconds > 0:
        res["idle"] = idle_cpu(e, a, log)
    rss = [(0, rss_bytes(pid))]
    t0 = time.monotonic()
    for i in range(1, a.memory_scrapes + 1):
        e.scrape()
        if i % 1000 == 0 or i == a.memory_scrapes:
            rss.append((i, rss_bytes(pid)))
    res["memory"] = {"scrapes": a.memory_scrapes, "seconds": round(time.monotonic() - t0, 1),
                     "rss_mib": [(i, round(b / 2**20, 1)) for i, b in rss],
                     "growth_mib_after_first_1000": round((rss[-1][1] - rss[min(1, len(rss) - 1)][1]) / 2**20, 1)}
    log(f"memory over {a.memory_scrapes} scrapes: RSS {res['memory']['rss_mib']} MiB")
    return res


def idle_cpu(e: Exporter, a: argparse.Namespace, log) -> dict:
    """The exporter's CPU over ``a.idle_seconds`` with one scrape every ``a.interval`` seconds."""
    pid = e.proc.pid
    c0, t0 = cpu_seconds(pid), time.monotonic()
    next_scrape = t0
    while time.monotonic() - t0 < a.idle_seconds:
        if time.monotonic() >= next_scrape:
            e.scrape()
            next_scrape += a.interval
        time.sleep(max(0.0, min(next_scrape, t0 + a.idle_seconds) - time.monotonic()))
    wall = time.monotonic() - t0
    pct_core = round(100 * (cpu_seconds(pid) - c0) / wall, 3)
    log(f"idle at one scrape per {a.interval:g} s: {pct_core} % of a core over {wall:.0f} s")
    return {"seconds": round(wall, 1), "interval_s": a.interval, "cpu_pct_of_core": pct_core}


def nvidia_smi_apps() -> dict[int, int]:
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    apps: dict[int, int] = {}
    for line in out.splitlines():
        if line.strip():
            pid, mib = (x.strip() for x in line.split(","))
            apps[int(pid)] = apps.get(int(pid), 0) + int(mib)
    return apps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--mode", choices=["sim", "nvml"], default="sim")
    ap.add_argument("--gpus", type=int, default=8, help="sim: GPUs of the simulated host")
    ap.add_argument("--holders", type=int, default=200, help="sim: holder processes (8 jobs)")
    ap.add_argument("--workers", type=int, default=8, help="nvml: torch workers under one launcher")
    ap.add_argument("--hold-gib", type=float, default=2.0, help="nvml: GiB each torch holder allocates")
    ap.add_argument("--scrapes", type=int, default=200)
    ap.add_argument("--interval", type=float, default=15.0)
    ap.add_argument("--idle-seconds", type=float, default=None, help="default 60 (sim), 30 (nvml)")
    ap.add_argument("--memory-scrapes", type=int, default=None, help="default 10000 (sim), 2000 (nvml)")
    a = ap.parse_args()
    a.idle_seconds = a.idle_seconds if a.idle_seconds is not None else (60.0 if a.mode == "sim" else 30.0)
    a.memory_scrapes = a.memory_scrapes if a.memory_scrapes is not None else (10000 if a.mode == "sim" else 2000)
    exit_on_sigterm()
    a.out.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []

    def log(msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S', time.gmtime())}Z] {msg}"
        lines.append(line)
        print(line, flush=True)

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, env.get("PYTHONPATH")) if p)
    result: dict = {"mode": a.mode, "python": sys.version.split()[0], "host": os.uname().nodename,
                    "cpus": os.cpu_count(), "loadavg_at_start": os.getloadavg()}
    procs: list[subprocess.Popen[str]] = []
    holders: Holders | None = None
    tmp = tempfile.mkdtemp(prefix="bench-exporter-")
    exporter: Exporter | None = None
    ok = True
    try:
        if a.mode == "sim":
            env["GPUSLATE_SIM"] = f"{tmp}/host"
            env["GPUSLATE_STATE_DIR"] = f"{tmp}/state"
            subprocess.run([sys.executable, "-m", "gpuslate", "sim", "init", f"{tmp}/host", "--count", str(a.gpus)],
                           env=env, check=True, stdout=subprocess.DEVNULL)
            jobs = 8
            per = [a.holders // jobs + (1 if j < a.holders % jobs else 0) for j in range(jobs)]
            for n in per:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "gpuslate", "sim", "hold", "--memory", "8GiB", "--gpus", f"0-{a.gpus - 1}",
                     "--workers", str(n), "--title", "sglang::scheduler_TP{rank}"],
                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, start_new_session=True))
            for p in procs:
                if not p.stdout.readline():  # type: ignore[union-attr]
                    raise RuntimeError("a simulated holder did not start")
            expect = a.holders * 1  # one GPU per worker when workers >= GPUs
            log(f"simulated host: {a.gpus} GPUs, {a.holders} holders in {jobs} jobs")
        else:
            env.pop("GPUSLATE_SIM", None)
            env["GPUSLATE_STATE_DIR"] = f"{tmp}/state"
            ngpu = visible_gpus()
            holders = Holders()
            holders.each(ngpu, int(a.hold_gib * GiB))
            holders.tree(a.workers, int(a.hold_gib * GiB), ngpu)
            procs.append(subprocess.Popen(["nvidia-smi", "-l", "1"], stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL, start_new_session=True))
            expect = None
            log(f"NVML: {ngpu} GPU(s), {ngpu + a.workers} torch holders, a monitor (nvidia-smi -l 1)")
        exporter = Exporter(env)
        if a.mode == "nvml":
            apps = nvidia_smi_apps()
            _, body = exporter.scrape()
            got = series_of(body)
            agree = {pid: (apps.get(pid), round(got.get(pid, -2**20) / 2**20)) for pid in {*apps, *got}}
            result["nvidia_smi"] = {"pids": len(apps), "agree": all(x == y for x, y in agree.values()),
                                    "by_pid_mib": {str(k): v for k, v in sorted(agree.items())}}
            log(f"series vs nvidia-smi --query-compute-apps: {len(apps)} pids, agree: {result['nvidia_smi']['agree']}"
                + ("" if result["nvidia_smi"]["agree"] else f" {agree}"))
            ok &= result["nvidia_smi"]["agree"] and len(apps) >= 1
        result.update(measure(exporter, a, log, expect))
        ok &= result["series_ok"]
        result["exporter_exit"] = exporter.stop()
        ok &= result["exporter_exit"] == 0
        exporter = None
    finally:
        if exporter is not None:
            exporter.stop()
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # each started in a session of its own: its whole group
            except ProcessLookupError:
                pass
            p.wait()
        if holders is not None:
            holders.close()
        shutil.rmtree(tmp, ignore_errors=True)
    result["ok"] = bool(ok)
    result["loadavg_at_end"] = os.getloadavg()  # the CPU machine is shared: scrape times follow its load
    stem = a.out / f"bench-exporter-{a.mode}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    c, s = result["client_ms"], result["server_ms"]
    stem.with_suffix(".md").write_text(
        f"| mode | process series | scrape median (HTTP) | p90 | max | exporter's own median | idle CPU at "
        f"{a.interval:g} s | RSS over {a.memory_scrapes} scrapes |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n"
        f"| {a.mode} | {result['process_series']} | {c['median']:.1f} ms | {c['p90']:.1f} ms | {c['max']:.1f} ms | "
        f"{s['median']:.1f} ms | {result['idle']['cpu_pct_of_core'] if result['idle']['cpu_pct_of_core'] is not None else '-'} % | "
        f"{' → '.join(str(m) for _, m in result['memory']['rss_mib'])} MiB |\n")
    stem.with_suffix(".log").write_text("\n".join(lines) + "\n")
    log(f"{'ok' if ok else 'FAILED'}: {stem}.json")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
