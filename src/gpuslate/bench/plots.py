"""The experiment's PNG plots. The only module of gpuslate that imports matplotlib
(with the Agg backend: files only, no display needed).

Every plot shows the statistic the tables show (throughput: the mean over
repeats with the min-max range; TTFT and ITL: the median, p99 dashed), against
concurrency on a log2 axis (levels 1, 2, 4 ... 128 evenly apart, each a tick
label; a linear axis crowded 1, 2 and 4 into its left edge), the y axis from 0;
the throughput plot marks the recommended threshold and the crossover
interval. The throughput-vs-speed plot labels each point with its ``c=N``,
placed where no other label is. Figures are in modelled time (see report.py).
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter, MaxNLocator, NullLocator
from matplotlib.transforms import Bbox

from .._walk import write_file

PLOTS = ("throughput_vs_concurrency.png", "ttft_vs_concurrency.png", "itl_vs_concurrency.png",
         "throughput_vs_speed.png")
_STYLE = {"baseline": ("tab:blue", "o"), "speculative": ("tab:orange", "s"),
          "speculative+threshold": ("tab:green", "^")}


def make_plots(rows: list[dict[str, Any]], out: Path, *, title: str, time_scale: float = 1.0,
               marks: dict[str, Any] | None = None) -> list[str]:
    """Write the plots into ``out``; return their file names (relative to ``out``)."""
    series: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        series.setdefault(r["deployment"], []).append(r)
    for rs in series.values():
        rs.sort(key=lambda r: r["concurrency"])
    levels = sorted({r["concurrency"] for r in rows})
    note = f" (modelled time, ran {time_scale:g}x faster)" if time_scale != 1 else ""

    def style(rs: list[dict[str, Any]], i: int) -> dict[str, Any]:
        color, marker = _STYLE.get(rs[0]["role"] or "", (f"C{i + 3}", "D"))
        return {"color": color, "marker": marker}

    def label(name: str, rs: list[dict[str, Any]]) -> str:
        return name + (f" ({rs[0]['role']})" if rs[0]["role"] and rs[0]["role"] != name else "")

    written = []
    # 1. output throughput vs concurrency: mean over repeats, min-max as error bars; threshold marked
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for i, (name, rs) in enumerate(series.items()):
        xs = [r["concurrency"] for r in rs]
        t = [r["output_token_throughput"] for r in rs]
        ys = [v["mean"] for v in t]
        err = [[v["mean"] - v["min"] for v in t], [v["max"] - v["mean"] for v in t]]
        ax.errorbar(xs, ys, yerr=err, capsize=3, label=label(name, rs), **style(rs, i))
    if marks and marks.get("crossover"):
        lo, hi = marks["crossover"]
        ax.axvspan(lo, hi, color="tab:red", alpha=0.08, label=f"crossover between {lo} and {hi}")
        if marks.get("threshold") is not None:
            word = "threshold" if marks.get("recommended") else "last clear win (not recommended)"
            ax.axvline(marks["threshold"], color="tab:red", linestyle=":", linewidth=1.5,
                       label=f"{word}: speculate while batch ≤ {marks['threshold']}")
    _axes(ax, levels, "concurrency (requests in flight)", "output throughput (tok/s)",
          f"{title}: output throughput (mean, min-max over repeats){note}")
    written.append(_save(fig, out, PLOTS[0]))

    # 2, 3. TTFT and ITL vs concurrency: median solid, p99 dashed (the tables' statistics)
    for stat, name_png, ylabel in (("ttft_ms", PLOTS[1], "time to first token (ms)"),
                                   ("itl_ms", PLOTS[2], "inter-token latency per token (ms)")):
        fig, ax = plt.subplots(figsize=(7.5, 4.8))
        for i, (name, rs) in enumerate(series.items()):
            xs = [r["concurrency"] for r in rs]
            st = style(rs, i)
            ax.plot(xs, [r[stat]["p50"] for r in rs], label=f"{label(name, rs)} median", **st)
            ax.plot(xs, [r[stat]["p99"] for r in rs], linestyle="--", alpha=0.6, label=f"{label(name, rs)} p99",
                    color=st["color"], marker=st["marker"], markerfacecolor="none")
        _axes(ax, levels, "concurrency (requests in flight)", ylabel,
              f"{title}: {ylabel.split(' (')[0]}{note}")
        written.append(_save(fig, out, name_png))

    # 4. throughput vs per-request speed: the trade-off curve, concurrency annotated (labels kept apart)
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    points: list[tuple[float, float, str, str]] = []
    for i, (name, rs) in enumerate(series.items()):
        pts = [(r["per_request_tok_s"], r["output_token_throughput"]["mean"], r["concurrency"])
               for r in rs if r["per_request_tok_s"]]
        if not pts:
            continue
        st = style(rs, i)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label(name, rs), **st)
        points += [(x, y, f"c={c}", st["color"]) for x, y, c in pts]
    ax.set_xlabel("per-request speed (tok/s per request, 1000 / TPOT)")
    ax.set_ylabel("output throughput (tok/s)")
    if points:  # room above and right of the last points for their labels
        ax.set_xlim(0, max(x for x, *_ in points) * 1.15)
        ax.set_ylim(0, max(y for _, y, *_ in points) * 1.18)
    ax.yaxis.set_major_formatter(FuncFormatter(_plain))
    ax.set_title(f"{title}: throughput vs per-request speed{note}", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    annotate_apart(fig, ax, points)
    written.append(_save(fig, out, PLOTS[3]))
    return written


#: where a point's label may go, in points from the point, nearest first
_OFFSETS = [(dx, dy) for r in range(1, 9) for dx, dy in
            ((5, 4 * r), (5, -6 - 8 * r), (-24 - 6 * r, 4 * r), (-24 - 6 * r, -6 - 8 * r), (5 + 12 * r, -2),
             (-10, 6 + 9 * r), (-10, -12 - 9 * r))]


def annotate_apart(fig: Any, ax: Any, points: list[tuple[float, float, str, str]]) -> list[Any]:
    """Label each point (x, y, text, colour) at the first of :data:`_OFFSETS` where its text, as
    drawn, stays inside the axes and covers no label placed before it and no point; the nearest
    when none is free."""
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    # the points' markers are in the way too: a label never covers one
    taken: list[Any] = [Bbox.from_bounds(px - 4, py - 4, 8, 8)
                        for px, py in ax.transData.transform([(x, y) for x, y, *_ in points])] if points else []
    out = []
    for x, y, text, color in points:
        chosen: tuple[Any, Any] | None = None
        for dx, dy in _OFFSETS:
            ann = ax.annotate(text, (x, y), textcoords="offset points", xytext=(dx, dy), fontsize=7, color=color)
            box = ann.get_window_extent(renderer).expanded(1.05, 1.1)
            inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
            if inside and not any(box.overlaps(t) for t in taken):
                chosen = (ann, box)
                break
            ann.remove()
        if chosen is None:  # no free place: the nearest
            ann = ax.annotate(text, (x, y), textcoords="offset points", xytext=_OFFSETS[0], fontsize=7,
                              color=color)
            chosen = (ann, ann.get_window_extent(renderer))
        taken.append(chosen[1])
        out.append(chosen[0])
    return out


def _plain(v: float, _pos: Any) -> str:
    return f"{v:,.0f}" if abs(v) >= 10 or v == 0 else f"{v:.2g}"


def _axes(ax: Any, levels: list[int], xlabel: str, ylabel: str, title: str) -> None:
    """Concurrency on a log2 axis, the measured levels as its ticks (thinned where two would
    touch: less than a third of a doubling apart); y from 0."""
    ax.set_xscale("log", base=2)
    lo, hi = (min(levels), max(levels)) if levels else (1, 2)
    ax.set_xlim(lo / 1.3, hi * 1.3)
    ax.set_ylim(bottom=0)
    ticks: list[int] = []
    for c in levels:
        if not ticks or math.log2(c) - math.log2(ticks[-1]) >= 1 / 3:
            ticks.append(c)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(c) for c in ticks])
    ax.yaxis.set_major_locator(MaxNLocator(nbins=7))
    ax.yaxis.set_major_formatter(FuncFormatter(_plain))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")


def _save(fig: Any, out: Path, name: str) -> str:
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    write_file(out / name, png.getvalue(), what="experiment directory")  # the walk: never another user's link
    return name
