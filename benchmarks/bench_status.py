"""`gpuslate status` (`--json` and the table) against the tools it is compared with, side by side.

    python3 benchmarks/bench_status.py --out DIR [--rounds 15] [--hold-gib 8] [--script PATH]
    python3 benchmarks/bench_status.py --out DIR --sim 2 [--before OLD_TREE]   # no GPU: a simulated host

Run on a GPU host. nvitop and gpustat are used when importable (this script
installs nothing: put their wheels on PYTHONPATH); a tool that is missing or
fails is reported ``unavailable`` with its error, and the others still run.
One torch process per visible GPU holds ``--hold-gib`` GiB, so that every tool
has a process on every GPU to report; they are the only GPU processes this
script starts. Writes ``bench-status.json``, ``bench-status.md`` (the table,
ratios to the Python floor and the goals) and ``bench-status.log`` to ``--out``.

With ``--sim N`` it runs without a GPU: a simulated host of N GPUs (``_simhost.py``), each held by a
``sim hold`` process, and ``python -c pass`` as the floor; ``--before DIR`` times a second source tree
(the code before a change) in the same rounds, for the after/before ratio of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _gpuhold import GiB, Holders, exit_on_sigterm, visible_gpus
from _simhost import SimHost
from _timing import interpreter_of, markdown, summarize, time_commands

FLOOR = "python: import pynvml; nvmlInit() (floor)"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--hold-gib", type=float, default=8, help="GiB held on every GPU (0: none)")
    ap.add_argument("--out", type=Path, required=True, help="folder for bench-status.json, .md and .log")
    ap.add_argument("--script", help="an installed `gpuslate` console script to time (default: python -m gpuslate)")
    ap.add_argument("--isolated-script",
                    help="also time gpuslate installed in a venv of its own (as pipx makes one), with that venv's "
                         "python for its own floor: the set-up 'own venv'")
    ap.add_argument("--as-is-only", action="store_true",
                    help="skip the 'bytecode cached' set-up (see RESULTS.md), halving the run")
    ap.add_argument("--sim", type=int, metavar="GPUS", help="no GPU: a simulated host of GPUS GPUs (see above)")
    ap.add_argument("--before", metavar="DIR", help="with --sim: also time the gpuslate source tree in DIR")
    a = ap.parse_args()
    exit_on_sigterm()
    a.out.mkdir(parents=True, exist_ok=True)
    if a.sim:
        sim_main(a)
        return
    logs: list[str] = []

    def log(msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S', time.gmtime())}Z] {msg}"
        logs.append(line)
        print(line, flush=True)

    py = sys.executable
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = dict(os.environ)
    if not a.script:  # an installed script brings its own package (and its bytecode)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    env.pop("GPUSLATE_SIM", None)
    ngpu = visible_gpus()
    gs = [a.script] if a.script else [py, "-m", "gpuslate"]
    base = {
        "python -c pass": [py, "-c", "pass"],
        FLOOR: [py, "-c", "import pynvml; pynvml.nvmlInit()"],
        "gpuslate status --json": [*gs, "status", "--json"],
        "gpuslate status (table)": [*gs, "status"],
        "nvitop --once": [py, "-m", "nvitop", "--once"],
        "gpustat --json": [py, "-m", "gpustat", "--json"],
    }
    # Two interpreter set-ups, timed in the same rounds: bytecode as the
    # environment has it (PYTHONDONTWRITEBYTECODE=1 on some images recompiles
    # every module at every start: pynvml alone is 6,000 lines), and bytecode
    # cached as after a normal `pip install` (PYTHONPYCACHEPREFIX, filled by the
    # warm-up rounds). Every Python tool gets the same treatment.
    as_is = dict(env)
    cached = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    cached["PYTHONPYCACHEPREFIX"] = "/tmp/gpuslate-bench-pycache"
    unavailable: dict[str, str] = {}
    holders = Holders()
    try:
        if a.hold_gib > 0:
            holders.each(ngpu, int(a.hold_gib * GiB))
            log(f"holding {a.hold_gib:g} GiB on each of {ngpu} GPUs")
        for name, cmd in base.items():  # what is missing or fails is reported, not timed
            p = subprocess.run(cmd, capture_output=True, text=True, env=as_is, timeout=120)
            if p.returncode != 0:
                unavailable[name] = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1][:300]
                log(f"{name}: unavailable ({unavailable[name]})")
        commands: dict[str, list[str]] = {"nvidia-smi": ["nvidia-smi"]}
        envs: dict[str, dict[str, str]] = {"nvidia-smi": env}
        for label, e in (("bytecode cached", cached), ("bytecode as-is", as_is)):
            if label == "bytecode cached" and a.as_is_only:
                continue
            if label == "bytecode as-is" and as_is.get("PYTHONDONTWRITEBYTECODE") is None and not a.as_is_only:
                continue
            for name, cmd in base.items():
                if name not in unavailable:
                    commands[f"{name} [{label}]"] = cmd
                    envs[f"{name} [{label}]"] = e
        if a.isolated_script:  # its own interpreter and packages only (no PYTHONPATH, no other site-packages)
            ipy = interpreter_of(a.isolated_script)
            iso_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
            for name, cmd in {"python -c pass": [ipy, "-c", "pass"], FLOOR: [ipy, *base[FLOOR][1:]],
                              "gpuslate status --json": [a.isolated_script, "status", "--json"],
                              "gpuslate status (table)": [a.isolated_script, "status"]}.items():
                commands[f"{name} [own venv]"] = cmd
                envs[f"{name} [own venv]"] = iso_env
        log(f"timing {len(commands)} commands, {a.rounds} rounds")
        times = time_commands(commands, a.rounds, envs)
    finally:
        holders.close()
    rows = []
    for label in ("bytecode cached", "bytecode as-is", "own venv"):
        sub = {k: v for k, v in times.items() if k.endswith(f"[{label}]") or k == "nvidia-smi"}
        if len(sub) > 1 and f"{FLOOR} [{label}]" in sub:
            rows += summarize(sub, f"{FLOOR} [{label}]")
    goals = _goals(rows)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "host": platform.node(),
            "python": platform.python_version(), "rounds": a.rounds, "held_gib_per_gpu": a.hold_gib, "gpus": ngpu,
            "command": "python3 benchmarks/bench_status.py " + " ".join(sys.argv[1:]),
            "gpuslate_invoked_as": " ".join(gs), "unavailable": unavailable,
            "env_PYTHONDONTWRITEBYTECODE": env.get("PYTHONDONTWRITEBYTECODE")}
    try:
        meta["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                     capture_output=True, text=True).stdout.strip().replace("\n", "; ")
    except OSError:
        pass
    md = "\n".join([f"- {meta['date']}, {meta['host']}, {ngpu} x {meta.get('gpu', '?')}, Python {meta['python']}; "
                    f"{a.rounds} rounds; {a.hold_gib:g} GiB held on every GPU.",
                    f"- Command: `{meta['command']}`", "", markdown(rows), "", *goals,
                    *(f"- {k}: unavailable ({v})" for k, v in unavailable.items())])
    print(md)
    (a.out / "bench-status.json").write_text(json.dumps({"meta": meta, "rows": rows, "goals": goals,
                                                        "times_ms": times}, indent=1))
    (a.out / "bench-status.md").write_text(md + "\n")
    (a.out / "bench-status.log").write_text("\n".join(logs) + "\n")


def sim_main(a: argparse.Namespace) -> None:
    """``status --json`` and the table on a simulated host, this tree and ``--before``'s, in the same rounds."""
    host = SimHost(a.sim, before=a.before)
    try:
        for gpu in range(a.sim):
            host.hold(gpu, a.hold_gib)
        commands: dict[str, list[str]] = {"python -c pass": [sys.executable, "-c", "pass"]}
        envs: dict[str, dict[str, str]] = {"python -c pass": host.env}
        for label, env in host.trees.items():
            for name, words in (("status --json", ("status", "--json")), ("status (table)", ("status",))):
                commands[f"{name} [{label}]"] = host.command(*words)
                envs[f"{name} [{label}]"] = env
        times = time_commands(commands, a.rounds, envs)
    finally:
        host.kill()
    rows = summarize(times, "python -c pass")
    by = {str(r["command"]): float(r["median_ms"]) for r in rows}
    ratios = [f"- {name}: after / before = {by[f'{name} [after]'] / by[f'{name} [before]']:.3f}"
              for name in ("status --json", "status (table)") if f"{name} [before]" in by]
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "host": platform.node(),
            "python": platform.python_version(), "rounds": a.rounds, "simulated_gpus": a.sim,
            "held_gib_per_gpu": a.hold_gib, "before": a.before, "load": os.getloadavg(),
            "command": "python3 benchmarks/bench_status.py " + " ".join(sys.argv[1:])}
    md = "\n".join([f"- {meta['date']}, {meta['host']}, a simulated host of {a.sim} GPUs, Python {meta['python']}; "
                    f"{a.rounds} rounds; load average {', '.join(f'{x:.1f}' for x in meta['load'])}.",
                    f"- Command: `{meta['command']}`", "", markdown(rows), "", *ratios])
    print(md)
    (a.out / "bench-status.json").write_text(json.dumps({"meta": meta, "rows": rows, "times_ms": times}, indent=1))
    (a.out / "bench-status.md").write_text(md + "\n")


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _goals(rows: list[dict]) -> list[str]:
    """The issue's goals, per set-up: --json <= 1.15x floor; table <= 1.25x floor and >= 1.5x faster than nvitop."""
    out = []
    for label in ("bytecode cached", "bytecode as-is", "own venv"):
        by = {str(r["command"]).removesuffix(f" [{label}]"): r for r in rows
              if str(r["command"]).endswith(f"[{label}]")}
        if "gpuslate status --json" not in by:
            continue
        j, t = by["gpuslate status --json"], by["gpuslate status (table)"]
        line = (f"- {label}: `status --json` {j['x_floor']}x floor (goal <= 1.15: {_met(j['x_floor'] <= 1.15)}); "
                f"table {t['x_floor']}x floor (goal <= 1.25: {_met(t['x_floor'] <= 1.25)})")
        if "nvitop --once" in by:
            ratio = float(by["nvitop --once"]["median_ms"]) / float(t["median_ms"])
            line += f"; nvitop --once / table = {ratio:.2f} (goal >= 1.5: {_met(ratio >= 1.5)})"
        if "gpustat --json" in by:
            gpustat = float(by["gpustat --json"]["median_ms"]) / float(j["median_ms"])
            line += f"; gpustat --json / status --json = {gpustat:.2f}"
        out.append(line)
    return out


if __name__ == "__main__":
    main()
