"""``experiment report DIR``: aggregate the points, recommend a threshold, write the report.

Reads ``DIR/experiment.json`` and ``DIR/points/*.json`` (nothing else), and
writes ``summary.json`` (the ``gpuslate.experiment.v1`` document),
``summary.csv``, the PNG plots (through :mod:`gpuslate.bench.plots`, the only
module that imports matplotlib) and ``report.md`` embedding them.

Figures of a repeat are aggregated per deployment and level: output
throughput as mean, min and max over the repeats (the spread the threshold
needs); latency statistics as the mean of each repeat's statistic. With
``time_scale`` S in the spec (simulated servers run S times faster than
modelled) throughputs are divided by S and latencies multiplied by S, so the
report shows the modelled system; the raw figures stay in the points.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import UsageError
from .experiment import POINT_SCHEMA, write_json_atomic
from .threshold import Recommendation, recommend

SCHEMA = "gpuslate.experiment.v1"
STATS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
CSV_COLUMNS = ("deployment", "role", "concurrency", "repeats", "completed", "failed", "output_tokens",
               "output_tok_s_mean", "output_tok_s_min", "output_tok_s_max", "request_per_s", "total_tok_s",
               "ttft_ms_mean", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_mean", "itl_ms_mean", "itl_ms_p50",
               "itl_ms_p99", "e2e_ms_mean", "e2e_ms_p50", "e2e_ms_p99", "per_request_tok_s", "accept_length")


@dataclass
class Report:
    summary: dict[str, Any]  # the gpuslate.experiment.v1 document
    recommendation: Recommendation | None
    files: list[str]

    def to_json(self) -> dict[str, Any]:
        return self.summary


def load_run(out: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The run manifest and every finished point (unreadable or foreign files are skipped)."""
    manifest = out / "experiment.json"
    try:
        run = json.loads(manifest.read_text())
    except FileNotFoundError:
        raise UsageError(f"{out} is not an experiment folder (no experiment.json)") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {manifest}: {exc}") from None
    points = []
    for p in sorted((out / "points").glob("*.json")):
        try:
            doc = json.loads(p.read_text())
        except (OSError, ValueError):
            continue  # only atomic renames land here; anything else is not ours
        if isinstance(doc, dict) and doc.get("schema") == POINT_SCHEMA:
            points.append(doc)
    return run, points


def aggregate(points: list[dict[str, Any]], time_scale: float = 1.0) -> list[dict[str, Any]]:
    """One row per (deployment, level), in the order points were listed."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for p in sorted(points, key=lambda p: (p["concurrency"], p["repeat"])):
        groups.setdefault((p["deployment"], p["concurrency"]), []).append(p)
    rows = []
    for (dep, c), ps in groups.items():
        lv = [p["level"] for p in ps]
        thr = [_round(v["output_token_throughput"] / time_scale, 4) for v in lv]
        row: dict[str, Any] = {
            "deployment": dep, "role": ps[0].get("role"), "concurrency": c, "repeats": len(ps),
            "completed": sum(v["completed"] for v in lv), "failed": sum(v["failed"] for v in lv),
            "output_tokens": sum(v["output_tokens"] for v in lv),
            "input_tokens": sum(v["input_tokens"] for v in lv),
            "output_token_throughput": {"mean": _round(_mean(thr), 4), "min": min(thr), "max": max(thr),
                                        "values": thr},
            "request_throughput": _round(_mean([v["request_throughput"] / time_scale for v in lv]), 4),
            "total_token_throughput": _round(_mean([v["total_token_throughput"] / time_scale for v in lv]), 4),
            "tokens_estimated": any(v.get("tokens_estimated") for v in lv),
        }
        for stat in STATS:
            row[stat] = {q: _round(_mean([_num(v[stat].get(q)) * time_scale for v in lv]), 4)
                         for q in ("mean", "p50", "p90", "p99")}
        tpot = row["tpot_ms"]["mean"]
        row["per_request_tok_s"] = _round(1000.0 / tpot, 4) if tpot and tpot > 0 else None
        acc = [v["accept_length"] for v in lv if v.get("accept_length") is not None]
        row["accept_length"] = _round(_mean(acc), 4) if acc else None
        rows.append(row)
    return rows


def build_summary(out: str | Path) -> tuple[dict[str, Any], Recommendation | None, list[dict[str, Any]]]:
    out = Path(out)
    run, points = load_run(out)
    spec = run.get("spec", {})
    scale = float(spec.get("time_scale", 1.0))
    order = [d["name"] for d in spec.get("deployments", [])]
    rows = sorted(aggregate(points, scale),
                  key=lambda r: (order.index(r["deployment"]) if r["deployment"] in order else len(order),
                                 r["concurrency"]))
    rec = _recommendation(spec, rows)
    total = len(order) * len(spec.get("levels", [])) * int(spec.get("repeats", 1))
    engines = {p["deployment"]: p.get("engine", {}) for p in points}
    counts: dict[str, int] = {}
    for p in points:
        counts[p["deployment"]] = counts.get(p["deployment"], 0) + 1
    summary = {
        "schema": SCHEMA, "name": spec.get("name"), "dir": str(out), "spec": spec.get("path"),
        "gpuslate_version": __version__, "created_at": run.get("created_at"),
        "complete": len(points) >= total > 0, "points": {"done": len(points), "total": total},
        "time_scale": scale,
        "deployments": [{"name": d["name"], "role": d.get("role"), "command": d.get("command"),
                         "engine": engines.get(d["name"]), "points": counts.get(d["name"], 0)}
                        for d in spec.get("deployments", [])],
        "levels": rows,
        "recommendation": rec.to_json() if rec else None,
        "threshold_check": _threshold_check(rows),
    }
    return summary, rec, rows


def write_report(out: str | Path) -> Report:
    """Write summary.json, summary.csv, the plots and report.md into ``out``."""
    out = Path(out)
    summary, rec, rows = build_summary(out)
    plots, note = _plots(rows, out, summary)
    summary["files"] = {"report": "report.md", "summary_json": "summary.json", "summary_csv": "summary.csv",
                        "plots": plots}
    summary["plots_note"] = note
    (out / "summary.csv").write_text(to_csv(rows))
    (out / "report.md").write_text(to_markdown(summary, rec, plots, note))
    write_json_atomic(out / "summary.json", summary)
    return Report(summary, rec, ["report.md", "summary.json", "summary.csv", *plots])


def _plots(rows: list[dict[str, Any]], out: Path, summary: dict[str, Any]) -> tuple[list[str], str | None]:
    if not rows:
        return [], "no points yet"
    try:  # matplotlib is optional for everything but the pictures; imported only by plots.py
        from . import plots
    except ImportError as exc:
        return [], f"plots skipped: {exc} (pip install matplotlib)"
    return plots.make_plots(rows, out, title=summary.get("name") or "experiment",
                            time_scale=summary["time_scale"]), None


def _recommendation(spec: dict[str, Any], rows: list[dict[str, Any]]) -> Recommendation | None:
    roles = {d.get("role"): d["name"] for d in spec.get("deployments", [])}
    if "baseline" not in roles or "speculative" not in roles:
        return None

    def figures(name: str) -> dict[int, list[float]]:
        return {r["concurrency"]: r["output_token_throughput"]["values"] for r in rows if r["deployment"] == name}

    try:
        return recommend(figures(roles["baseline"]), figures(roles["speculative"]),
                         min_margin=float(spec.get("min_margin", 0.0)),
                         num_speculative_tokens=int(spec.get("num_speculative_tokens", 3)))
    except ValueError:  # no level measured for both yet
        return None


def _threshold_check(rows: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """Per level: the speculative+threshold deployment against the better of baseline and speculative."""
    by: dict[str, dict[int, float]] = {}
    for r in rows:
        if r["role"]:
            by.setdefault(r["role"], {})[r["concurrency"]] = r["output_token_throughput"]["mean"]
    if not {"baseline", "speculative", "speculative+threshold"} <= set(by):
        return None
    out = []
    for c, v in sorted(by["speculative+threshold"].items()):
        best = max(by["baseline"].get(c, 0.0), by["speculative"].get(c, 0.0))
        if best > 0:
            out.append({"concurrency": c, "throughput": _round(v), "best_of_both": _round(best),
                        "ratio": _round(v / best, 4)})
    return out


# -- writers ------------------------------------------------------------------------


def to_csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for r in rows:
        t = r["output_token_throughput"]
        w.writerow([r["deployment"], r["role"] or "", r["concurrency"], r["repeats"], r["completed"], r["failed"],
                    r["output_tokens"], _round(t["mean"]), _round(t["min"]), _round(t["max"]),
                    _round(r["request_throughput"], 4), _round(r["total_token_throughput"]),
                    _round(r["ttft_ms"]["mean"], 3), _round(r["ttft_ms"]["p50"], 3), _round(r["ttft_ms"]["p99"], 3),
                    _round(r["tpot_ms"]["mean"], 3), _round(r["itl_ms"]["mean"], 3), _round(r["itl_ms"]["p50"], 3),
                    _round(r["itl_ms"]["p99"], 3), _round(r["e2e_ms"]["mean"], 3), _round(r["e2e_ms"]["p50"], 3),
                    _round(r["e2e_ms"]["p99"], 3), _round(r["per_request_tok_s"]),
                    "" if r["accept_length"] is None else _round(r["accept_length"], 3)])
    return buf.getvalue()


def level_tables(rows: list[dict[str, Any]]) -> list[tuple[int, list[list[str]]]]:
    """Per concurrency level: a header row and one row per deployment (shared by report.md and the CLI)."""
    head = ["deployment", "output tok/s", "spread", "req/s", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99",
            "TPOT", "e2e p50", "ok/failed"]
    levels: dict[int, list[list[str]]] = {}
    for r in rows:
        t = r["output_token_throughput"]
        spread = (t["max"] - t["min"]) / t["mean"] if t["mean"] else 0.0  # mean 0: nothing completed
        levels.setdefault(r["concurrency"], [head]).append([
            r["deployment"] + (f" ({r['role']})" if r["role"] and r["role"] != r["deployment"] else ""),
            f"{t['mean']:.1f}", f"±{spread / 2:.1%}" if r["repeats"] > 1 else "-", f"{r['request_throughput']:.2f}",
            _ms(r["ttft_ms"]["p50"]), _ms(r["ttft_ms"]["p99"]), _ms(r["itl_ms"]["p50"]), _ms(r["itl_ms"]["p99"]),
            _ms(r["tpot_ms"]["mean"]), _ms(r["e2e_ms"]["p50"]), f"{r['completed']}/{r['failed']}"])
    return sorted(levels.items())


def to_markdown(summary: dict[str, Any], rec: Recommendation | None, plots: list[str], note: str | None) -> str:
    lines = [f"# Experiment {summary['name']}", ""]
    pts = summary["points"]
    lines.append(f"{pts['done']} of {pts['total']} points" + ("" if summary["complete"] else " (incomplete)")
                 + f"; gpuslate {summary['gpuslate_version']}; spec `{summary['spec']}` (a copy: `spec.toml`).")
    if summary["time_scale"] != 1:
        lines.append(f"Simulated servers ran at time-scale {summary['time_scale']:g}: throughputs are divided "
                     "and latencies multiplied by it (the raw figures are in `points/`).")
    lines += ["", "## Deployments", "", "| deployment | role | engine | command |", "| --- | --- | --- | --- |"]
    for d in summary["deployments"]:
        eng = d.get("engine") or {}
        engine = " ".join(str(x) for x in (eng.get("engine"), eng.get("version")) if x) or "-"
        cmd = " ".join(d.get("command") or []).replace("|", "\\|")
        lines.append(f"| {d['name']} | {d.get('role') or '-'} | {engine} | `{cmd}` |")
    if rec is not None:
        lines += ["", "## Recommendation", "", f"**{rec.summary()}**", ""]
        lines += [f"- {ln}" for ln in rec.engine_lines()]
        lines += [f"- warning: {w}" for w in rec.warnings]
        lines += ["", "| concurrency | winner | margin | spread |", "| ---: | --- | ---: | ---: |"]
        lines += [f"| {v.concurrency} | {v.winner} | {v.margin:+.1%} | {v.spread:.1%} |" for v in rec.levels]
    if summary.get("threshold_check"):
        lines += ["", "Speculation with the disable threshold against the better of the two, per level:", "",
                  "| concurrency | tok/s | best of both | ratio |", "| ---: | ---: | ---: | ---: |"]
        lines += [f"| {c['concurrency']} | {c['throughput']} | {c['best_of_both']} | {c['ratio']:.3f} |"
                  for c in summary["threshold_check"]]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{Path(p).stem}]({p})" for p in plots]
    elif note:
        lines += ["", f"_{note}_"]
    lines += ["", "## Per concurrency level", "",
              "Latencies in ms (TTFT, ITL percentiles and TPOT: the mean over repeats of each repeat's figure); "
              "spread: half the max-min range of output tok/s over repeats, relative."]
    for c, table in level_tables(summary["levels"]):
        lines += ["", f"### Concurrency {c}", "", "| " + " | ".join(table[0]) + " |",
                  "|" + "|".join(" --- " if i == 0 else " ---: " for i in range(len(table[0]))) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in table[1:]]
    return "\n".join(lines) + "\n"


def _mean(xs: list[float]) -> float:
    """Mean of the finite values; NaN (reported as null) when there are none."""
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return sum(xs) / len(xs) if xs else math.nan


def _num(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) else math.nan


def _round(v: float | None, nd: int = 2) -> float | None:
    return None if v is None or not math.isfinite(v) else round(v, nd)


def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.1f}" if v >= 10 else f"{v:.2f}"
