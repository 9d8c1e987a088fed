"""`status` and `clear` on a simulated host: this tree against another, in one run, rounds interleaved.

    python3 benchmarks/bench_sim_ab.py --before SRC [--rounds 30] [--no-mps] [--out DIR]

``SRC`` is the ``src`` folder of the tree to compare with (``git archive BASE src | tar -x -C
/tmp/before`` makes one: ``--before /tmp/before/src``). No GPU: a simulated host of 8 GPUs in a
temporary folder, with what makes the daemon and MPS rules work on every reading: a simulated MPS
server on GPUs 0-3 with two MPS clients (its daemon proof, its clients' pipe folders), a launcher
with 8 workers on GPUs 0-7 (started with ``--orphan-workers``); ``--no-mps``: the launcher alone.
Timed, whole commands, each tree with the same interpreter and the same host:

* ``status --json`` and ``status`` (the table);
* ``clear --dry-run --json`` (the plan over every GPU);
* ``clear --yes --pid P --json`` of a holder started for it on GPU 7 (1 GiB), a fresh one for each
  command, its start not timed.

Both trees are byte-compiled first (``compileall``: as ``pip install`` leaves a package; a tree
without bytecode, say under ``PYTHONDONTWRITEBYTECODE``, would pay for compiling at every start).
Rounds alternate which tree goes first. Each command's CPU time (user + system, of the command
and what it waits for) is kept beside its wall time: on a machine that others load, wall times
move with their load, CPU times much less. Writes ``bench-sim-ab.json`` and ``.md``
(``bench-sim-ab-no-mps.*`` with ``--no-mps``) to ``--out`` (default: ``benchmarks/results``):
medians, p10/p90, and after / before.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

AFTER = str(Path(__file__).resolve().parents[1] / "src")


def env_of(src: str, sim: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSLATE_")}
    env.update(PYTHONPATH=src, GPUSLATE_SIM=sim, GPUSLATE_STATE_DIR=str(Path(sim).parent / "state"),
               GPUSLATE_LOCK_DIR=str(Path(sim).parent / "locks"))
    return env


def start(args: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[str], dict]:
    """A ``gpuslate sim ...`` process of its own session, once its ready line is in."""
    p = subprocess.Popen([sys.executable, "-m", "gpuslate", "sim", *args], stdout=subprocess.PIPE, text=True,
                         env=env, start_new_session=True)
    assert p.stdout is not None
    if not select.select([p.stdout], [], [], 30)[0]:
        p.kill()
        raise RuntimeError(f"sim {' '.join(args)} did not become ready")
    return p, json.loads(p.stdout.readline())


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall ms, CPU ms) of one run of ``argv``."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    dt = (time.perf_counter() - t0) * 1000
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode not in (0, 4):  # 4: the dry run's GPUs are not free (it plans, signals nothing)
        raise RuntimeError(f"{' '.join(argv[3:])} failed ({p.returncode}): {p.stderr.decode()[-400:]}")
    return dt, (r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime) * 1000


def _spread(ts: list[float]) -> list[float]:
    s = sorted(ts)
    return [round(s[len(s) // 10], 1), round(s[-len(s) // 10 - 1], 1)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="the src folder of the tree to compare with")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--no-mps", action="store_true", help="no MPS server and clients on the host")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    a = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="gpuslate-ab-"))
    sim = str(base / "sim")
    trees = {"before": str(Path(a.before).resolve()), "after": AFTER}
    host_env = env_of(AFTER, sim)
    for src in trees.values():
        subprocess.run([sys.executable, "-m", "compileall", "-q", src], check=True, stdout=subprocess.DEVNULL,
                       env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"})
    subprocess.run([sys.executable, "-m", "gpuslate", "sim", "init", sim, "--count", "8", "--release-delay", "0.02"],
                   check=True, env=host_env, stdout=subprocess.DEVNULL)
    started: list[subprocess.Popen[str]] = []
    try:
        mps = [] if a.no_mps else [
            ["mps", "--gpus", "0-3"], ["hold", "--mps", "--gpus", "0", "--memory", "2GiB"],
            ["hold", "--mps", "--gpus", "1", "--memory", "2GiB", "--title", "sglang::scheduler_TP0"]]
        for args in [*mps, ["hold", "--gpus", "0-7", "--workers", "8", "--memory", "8GiB", "--orphan-workers"]]:
            started.append(start(args, host_env)[0])
        py = [sys.executable, "-m", "gpuslate"]
        reads = {"status --json": [*py, "status", "--json"], "status (table)": [*py, "status"],
                 "clear --dry-run --json": [*py, "clear", "--dry-run", "--json"]}
        samples: dict[tuple[str, str], list[float]] = {(c, t): [] for c in [*reads, "clear --yes --pid"] for t in trees}
        cpu: dict[tuple[str, str], list[float]] = {k: [] for k in samples}
        names = list(trees)
        for r in range(a.rounds + 2):  # two warm-up rounds
            order = names if r % 2 == 0 else names[::-1]
            for tree in order:
                env = env_of(trees[tree], sim)
                for cmd, argv in reads.items():
                    dt, ct = timed(argv, env)
                    if r >= 2:
                        samples[(cmd, tree)].append(dt)
                        cpu[(cmd, tree)].append(ct)
                p, ready = start(["hold", "--gpus", "7", "--memory", "1GiB"], host_env)
                started.append(p)
                dt, ct = timed([*py, "clear", "--yes", "--pid", str(ready["pid"]), "--json", "--grace", "5"], env)
                p.wait(10)
                if r >= 2:
                    samples[("clear --yes --pid", tree)].append(dt)
                    cpu[("clear --yes --pid", tree)].append(ct)
        rows = []
        for cmd in [*reads, "clear --yes --pid"]:
            b, af = samples[(cmd, "before")], samples[(cmd, "after")]
            rows.append({"command": cmd, "before_ms": round(statistics.median(b), 1),
                         "after_ms": round(statistics.median(af), 1),
                         "after_p10_p90_ms": _spread(af), "before_p10_p90_ms": _spread(b),
                         "after_over_before": round(statistics.median(af) / statistics.median(b), 3),
                         "before_cpu_ms": round(statistics.median(cpu[(cmd, "before")]), 1),
                         "after_cpu_ms": round(statistics.median(cpu[(cmd, "after")]), 1),
                         "cpu_after_over_before": round(statistics.median(cpu[(cmd, "after")])
                                                        / statistics.median(cpu[(cmd, "before")]), 3)})
        meta = {"date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "machine": platform.node(), "mps": not a.no_mps,
                "cpus": os.cpu_count(), "python": platform.python_version(), "rounds": a.rounds,
                "command": " ".join(sys.argv), "before": trees["before"], "after": trees["after"]}
        a.out.mkdir(parents=True, exist_ok=True)
        name = "bench-sim-ab" + ("-no-mps" if a.no_mps else "")
        (a.out / f"{name}.json").write_text(json.dumps({"meta": meta, "rows": rows, "samples": {
            f"{c} [{t}]": v for (c, t), v in samples.items()}}, indent=1))
        lines = ["| command | wall before ms | wall after ms | after / before | CPU before ms | CPU after ms "
                 "| after / before |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        lines += [f"| `{r['command']}` | {r['before_ms']} | {r['after_ms']} | {r['after_over_before']} | "
                  f"{r['before_cpu_ms']} | {r['after_cpu_ms']} | {r['cpu_after_over_before']} |" for r in rows]
        text = (f"{meta['date_utc']} UTC, {meta['machine']} ({meta['cpus']} CPUs), {a.rounds} rounds\n\n"
                + "\n".join(lines))
        (a.out / f"{name}.md").write_text(text + "\n")
        print(text)
    finally:
        for p in started:  # SIGTERM first: `sim mps` then ends its server and control daemon (their own session)
            p.terminate()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(p.pid, 9)  # a launcher's workers, in its group
            except (ProcessLookupError, PermissionError):
                pass
            p.wait()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
