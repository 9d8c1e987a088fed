"""Side-by-side timing of whole commands: interleaved rounds, medians, ratios."""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from collections.abc import Sequence


def interpreter_of(script: str) -> str:
    """The interpreter of a console script (its #! line), e.g. to time a floor in the same venv."""
    with open(script) as f:
        return f.readline()[2:].strip().split()[0]


def time_commands(commands: dict[str, Sequence[str]], rounds: int,
                  env: dict[str, str] | dict[str, dict[str, str]] | None = None,
                  warmup: int = 2) -> dict[str, list[float]]:
    """Run every command once per round, in a rotating order, and return wall times in ms.

    Interleaving puts each tool under the same conditions (page cache, clocks,
    background load) instead of timing one tool's run after another's.
    """
    names = list(commands)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(warmup + rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for n in order:
            t0 = time.perf_counter()
            e = env.get(n) if env and isinstance(env.get(n), dict) else env  # per-command or shared
            p = subprocess.run(commands[n], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               env=e or dict(os.environ))
            dt = (time.perf_counter() - t0) * 1000
            if p.returncode != 0:
                raise RuntimeError(f"{n} failed ({p.returncode}): {p.stderr.decode()[-500:]}")
            if r >= warmup:
                times[n].append(dt)
    return times


def summarize(times: dict[str, list[float]], reference: str) -> list[dict[str, float | str]]:
    """Median, spread and the ratio of each median to ``reference``'s median (x_floor)."""
    ref = statistics.median(times[reference])
    rows = []
    for n, ts in times.items():
        med = statistics.median(ts)
        rows.append({"command": n, "median_ms": round(med, 1), "p10_ms": round(_pct(ts, 10), 1),
                     "p90_ms": round(_pct(ts, 90), 1), "runs": len(ts), "x_floor": round(med / ref, 2)})
    return rows


def _pct(ts: list[float], p: int) -> float:
    s = sorted(ts)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


def markdown(rows: list[dict[str, float | str]]) -> str:
    keys = list(rows[0])
    out = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    out += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(out)


def report(meta: dict, rows: list[dict], times: dict[str, list[float]], out: str | None) -> None:
    """Print the run's metadata and table; write everything as JSON to ``out``."""
    import json
    from pathlib import Path

    print(json.dumps(meta))
    print(markdown(rows))
    if out:
        Path(out).write_text(json.dumps({"meta": meta, "rows": rows, "times_ms": times}, indent=1))
