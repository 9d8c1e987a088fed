"""Two runs of ``run_device.sh fast`` on one machine, side by side: before and after a change.

    python3 benchmarks/compare_runs.py BEFORE_DIR AFTER_DIR [--out FILE]

Reads each run's ``bench-status.md`` (every command's median and its ratio to the Python+NVML floor
measured in the same run), ``bench-clear.md`` (gpuslate's clear and the careful script, in ms) and
``profile-clear.md`` (where clear's time goes), and writes one Markdown table of the figures that
matter, before and after, with the after/before ratio. Ratios to a floor measured in the same run are
what compare across runs; the milliseconds are there for the record.
"""

from __future__ import annotations

import argparse
import re
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


def compare(before: Path, after: Path) -> str:
    lines = ["| figure | before | after | after ÷ before |", "| --- | ---: | ---: | ---: |"]
    sb, sa = status_rows(before), status_rows(after)
    for name in sa:
        if name.startswith("gpuslate") and name in sb:
            lines.append(f"| {name}: × floor | {fmt(sb[name][1])} | {fmt(sa[name][1])} | "
                         f"{ratio(sa[name][1], sb[name][1])} |")
    cb, ca = clear_rows(before), clear_rows(after)
    for name in ca:
        if name in cb:
            (gb, kb), (ga, ka) = cb[name], ca[name]
            rb = gb / kb if gb and kb else None
            ra = ga / ka if ga and ka else None
            lines.append(f"| clear {name}: gpuslate ÷ careful | {fmt(rb)} | {fmt(ra)} | {ratio(ra, rb)} |")
            lines.append(f"| clear {name}: gpuslate ms | {fmt(gb, 0)} | {fmt(ga, 0)} | {ratio(ga, gb)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    text = f"Before: {a.before}\nAfter: {a.after}\n\n" + compare(a.before, a.after)
    if a.out:
        a.out.write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
