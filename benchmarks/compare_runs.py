"""Two runs of ``run_device.sh fast`` on one machine, side by side: before and after a change.

    python3 benchmarks/compare_runs.py BEFORE_DIR[,BEFORE_DIR...] AFTER_DIR[,AFTER_DIR...] [--out FILE]

Reads each run's ``bench-status.md`` (every command's median and its ratio to the Python+NVML floor
measured in the same run), ``bench-clear.md`` (gpuslate's clear and the careful script, in ms) and
``profile-clear.md`` (where clear's time goes), and writes one Markdown table of the figures that
matter, before and after, with the after/before ratio. Ratios to a floor measured in the same run are
what compare across runs; the milliseconds are there for the record. Several runs of each (taken in
turns, before/after/before/after, so that a machine's drift falls on both): the median of each figure.
"""

from __future__ import annotations

import argparse
import re
import statistics
from pathlib import Path


def tables(text: str) -> list[list[list[str]]]:
    """Every Markdown table of ``text``, as rows of cells (the separator rows left out)."""
    out: list[list[list[str]]] = []
    current: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                current.append(cells)
        elif current:
            out.append(current)
            current = []
    if current:
        out.append(current)
    return out


def number(cell: str) -> float | None:
    m = re.search(r"-?\d+(\.\d+)?", cell.replace("*", ""))
    return float(m.group(0)) if m else None


def status_rows(run: Path) -> dict[str, tuple[float | None, float | None]]:
    """command -> (median ms, x floor), from bench-status.md's first table."""
    found = tables((run / "bench-status.md").read_text()) if (run / "bench-status.md").is_file() else []
    if not found:
        return {}
    head, *rows = found[0]
    mi, xi = head.index("median_ms"), head.index("x_floor")
    return {r[0]: (number(r[mi]), number(r[xi])) for r in rows if len(r) > max(mi, xi)}


def clear_rows(run: Path) -> dict[str, tuple[float | None, float | None]]:
    """workload -> (gpuslate ms, careful ms), from bench-clear.md's first table."""
    found = tables((run / "bench-clear.md").read_text()) if (run / "bench-clear.md").is_file() else []
    if not found:
        return {}
    head, *rows = found[0]
    gi = next(i for i, h in enumerate(head) if h.startswith("gpuslate"))
    ci = next(i for i, h in enumerate(head) if h.startswith("careful ms"))
    return {r[0]: (number(r[gi]), number(r[ci])) for r in rows if len(r) > max(gi, ci)}


def fmt(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def ratio(after: float | None, before: float | None) -> str:
    return "-" if after is None or not before else f"{after / before:.2f}"


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _status(runs: list[Path]) -> dict[str, tuple[float | None, float | None]]:
    each = [rows for rows in map(status_rows, runs) if rows]  # a run may hold only clear's figures
    names = [n for n in each[0] if all(n in e for e in each)] if each else []
    return {n: (_median([e[n][0] for e in each]), _median([e[n][1] for e in each])) for n in names}


def _clear(runs: list[Path]) -> dict[str, tuple[float | None, float | None]]:
    """workload -> (gpuslate ms, gpuslate ÷ careful), medians over the runs."""
    each = [rows for rows in map(clear_rows, runs) if rows]  # or only status's
    names = [n for n in each[0] if all(n in e for e in each)] if each else []
    return {n: (_median([e[n][0] for e in each]),
                _median([e[n][0] / e[n][1] if e[n][0] and e[n][1] else None for e in each])) for n in names}


def compare(before: list[Path], after: list[Path]) -> str:
    lines = ["| figure | before | after | after ÷ before |", "| --- | ---: | ---: | ---: |"]
    sb, sa = _status(before), _status(after)
    for name in sa:
        if name.startswith("gpuslate") and name in sb:
            lines.append(f"| {name}: × floor | {fmt(sb[name][1])} | {fmt(sa[name][1])} | "
                         f"{ratio(sa[name][1], sb[name][1])} |")
            lines.append(f"| {name}: ms | {fmt(sb[name][0], 1)} | {fmt(sa[name][0], 1)} | "
                         f"{ratio(sa[name][0], sb[name][0])} |")
    cb, ca = _clear(before), _clear(after)
    for name in ca:
        if name in cb:
            (gb, rb), (ga, ra) = cb[name], ca[name]
            lines.append(f"| clear {name}: gpuslate ÷ careful | {fmt(rb)} | {fmt(ra)} | {ratio(ra, rb)} |")
            lines.append(f"| clear {name}: gpuslate ms | {fmt(gb, 0)} | {fmt(ga, 0)} | {ratio(ga, gb)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", help="run folders, comma-separated")
    ap.add_argument("after", help="run folders, comma-separated")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    before, after = ([Path(d) for d in arg.split(",") if d] for arg in (a.before, a.after))
    text = f"Before: {', '.join(map(str, before))}\nAfter: {', '.join(map(str, after))}\n\n" + compare(before, after)
    if a.out:
        a.out.write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
