"""The experiment's PNG plots. The only module of gpuslate that imports matplotlib
(with the Agg backend: files only, no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

PLOTS = ("throughput_vs_concurrency.png", "ttft_vs_concurrency.png", "itl_vs_concurrency.png",
         "throughput_vs_speed.png")
_STYLE = {"baseline": ("tab:blue", "o"), "speculative": ("tab:orange", "s"),
          "speculative+threshold": ("tab:green", "^")}


def make_plots(rows: list[dict[str, Any]], out: Path, *, title: str, time_scale: float = 1.0) -> list[str]:
    """Write the plots into ``out``; return their file names (relative to ``out``)."""
    series: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        series.setdefault(r["deployment"], []).append(r)
    for rs in series.values():
        rs.sort(key=lambda r: r["concurrency"])
    note = f" (time-scale {time_scale:g}, unscaled)" if time_scale != 1 else ""

    def style(rs: list[dict[str, Any]], i: int) -> dict[str, Any]:
        color, marker = _STYLE.get(rs[0]["role"] or "", (f"C{i + 3}", "D"))
        return {"color": color, "marker": marker}

    def label(name: str, rs: list[dict[str, Any]]) -> str:
        return name + (f" ({rs[0]['role']})" if rs[0]["role"] and rs[0]["role"] != name else "")

    written = []
    # 1. output throughput vs concurrency, with the run-to-run range as error bars
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (name, rs) in enumerate(series.items()):
        xs = [r["concurrency"] for r in rs]
        t = [r["output_token_throughput"] for r in rs]
        ys = [v["mean"] for v in t]
        err = [[v["mean"] - v["min"] for v in t], [v["max"] - v["mean"] for v in t]]
        ax.errorbar(xs, ys, yerr=err, capsize=3, label=label(name, rs), **style(rs, i))
    _axes(ax, "concurrency (requests in flight)", "output throughput (tok/s)",
          f"{title}: output throughput vs concurrency{note}")
    written.append(_save(fig, out, PLOTS[0]))

    # 2, 3. TTFT and ITL vs concurrency (solid: TTFT p50, ITL mean; dashed: p99). The ITL median is
    # not drawn: chunks that arrive together have near-zero gaps, which move the median, not the mean.
    for stat, central, name_png, ylabel in (("ttft_ms", "p50", PLOTS[1], "time to first token (ms)"),
                                            ("itl_ms", "mean", PLOTS[2], "inter-token latency (ms)")):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for i, (name, rs) in enumerate(series.items()):
            xs = [r["concurrency"] for r in rs]
            st = style(rs, i)
            ax.plot(xs, [r[stat][central] for r in rs], label=f"{label(name, rs)} {central}", **st)
            ax.plot(xs, [r[stat]["p99"] for r in rs], linestyle="--", alpha=0.6, label=f"{label(name, rs)} p99",
                    color=st["color"], marker=st["marker"], markerfacecolor="none")
        ax.set_yscale("log")
        _axes(ax, "concurrency (requests in flight)", ylabel, f"{title}: {ylabel.split(' (')[0]}{note}")
        written.append(_save(fig, out, name_png))

    # 4. throughput vs per-request speed: the trade-off curve, concurrency annotated
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (name, rs) in enumerate(series.items()):
        pts = [(r["per_request_tok_s"], r["output_token_throughput"]["mean"], r["concurrency"])
               for r in rs if r["per_request_tok_s"]]
        if not pts:
            continue
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label(name, rs), **style(rs, i))
        for x, y, c in pts:
            ax.annotate(str(c), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xlabel("per-request speed (tok/s per request, 1000 / TPOT)")
    ax.set_ylabel("output throughput (tok/s)")
    ax.set_title(f"{title}: throughput vs per-request speed{note}", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    written.append(_save(fig, out, PLOTS[3]))
    return written


def _axes(ax: Any, xlabel: str, ylabel: str, title: str) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)


def _save(fig: Any, out: Path, name: str) -> str:
    fig.tight_layout()
    fig.savefig(out / name, dpi=100)
    plt.close(fig)
    return name
