"""The output of ``gpuslate bench`` for people. ``--json`` never comes through here.

First, for each level, the summary block of vLLM's ``vllm bench serve`` (benchmarks/serve.py), line
for line where a figure is the same (duration, requests, tokens, throughputs, the mean, median and
p99 of TTFT, TPOT, ITL and end-to-end latency), so that a run reads as vLLM's does; then the levels
side by side in one table, whose latencies show the median and p99 (the JSON has mean, std, max and
every percentile asked for). Nothing is ever cut: piped, the table is as wide as its
values (about 140 columns); on a terminal too narrow for it (80 columns), it is
shown as several tables one under the other, each starting with the level
(``Conc``), so that every row says which level it is (see :func:`.plain.tables`).
Laid out by :mod:`.plain`, like ``status``.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from .plain import Cell, Column, paint, safe, tables, use_color, width_of, wrapped

if TYPE_CHECKING:
    from ...bench import BenchResult
    from ...bench.metrics import LevelResult, Summary


def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def _pair(s: Summary | None) -> str:
    return "-" if s is None else f"{_ms(s.p50)} / {_ms(s.p99)}"


def _accept(lv: LevelResult) -> str:
    if lv.accept_length is not None:
        return f"{lv.accept_length:.2f}"
    if lv.accept_length_spec is not None:
        return f"{lv.accept_length_spec:.2f}ˢ"
    return "-"


def _connection_note(connection: str) -> str:
    """What TTFT and E2E hold, by the run's connection convention (the plan's ``connection``)."""
    if connection == "per-request":
        return "TTFT and E2E include a new connection per request (as SGLang's bench_serving)"
    return "TTFT and E2E on reused connections (as vLLM's bench serve; SGLang's: --connection per-request)"


def level_label(lv: LevelResult) -> str:
    """What names a level in every row: its concurrency (or request rate), ``*`` when an interrupt
    cut it short, ``!`` when the server was still warming up."""
    conc = str(lv.concurrency) if lv.concurrency is not None else (
        f"{lv.request_rate:g}/s" + (f" ≤{lv.max_concurrency}" if lv.max_concurrency else ""))
    return conc + ("*" if lv.interrupted else "") + ("!" if lv.warming else "")


def _rule(title: str, fill: str) -> str:
    return f"{title:{fill}^50}"  # vLLM's "{s:{c}^{n}}" with n=50


def _line(label: str, value: object) -> str:
    return f"{label:<40} {value}"  # vLLM's "{:<40} {:<10}", its trailing spaces left out


def summary_block(lv: LevelResult) -> list[str]:
    """One level as ``vllm bench serve`` prints its run: the same lines, labels and order (a figure
    vLLM has not, ours, after its own: the acceptance of speculative decoding, the chunk gap)."""
    est = " (estimated)" if lv.tokens_estimated else ""
    what = f"concurrency {lv.concurrency}" if lv.concurrency is not None else f"{lv.request_rate:g} req/s"
    lines = [_rule(f" Serving Benchmark Result ({what}{', cut short' if lv.interrupted else ''}) ", "="),
             _line("Successful requests:", lv.completed), _line("Failed requests:", lv.failed)]
    if lv.concurrency is not None or lv.max_concurrency is not None:
        lines.append(_line("Maximum request concurrency:", lv.concurrency or lv.max_concurrency))
    if lv.request_rate is not None and lv.request_rate != float("inf"):
        lines.append(_line("Request rate configured (RPS):", f"{lv.request_rate:.2f}"))
    lines += [_line("Benchmark duration (s):", f"{lv.duration_s:.2f}"),
              _line("Total input tokens:", f"{lv.input_tokens}{est}"),
              _line("Total generated tokens:", f"{lv.output_tokens}{est}"),
              _line("Request throughput (req/s):", f"{lv.request_throughput:.2f}")]
    if lv.goodput is not None:
        lines.append(_line("Request goodput (req/s):", f"{lv.goodput:.2f}"))
    lines += [_line("Output token throughput (tok/s):", f"{lv.output_token_throughput:.2f}"),
              _line("Peak output token throughput (tok/s):", f"{lv.peak_output_token_throughput:.2f}"),
              _line("Total token throughput (tok/s):", f"{lv.total_token_throughput:.2f}")]
    for name, header, summary in (("TTFT", "Time to First Token", lv.ttft_ms),
                                  ("TPOT", "Time per Output Token (excl. 1st token)", lv.tpot_ms),
                                  ("ITL", "Inter-token Latency", lv.itl_ms),
                                  ("E2EL", "End-to-end Latency", lv.e2e_ms)):
        lines += [_rule(header, "-")] + [_line(f"{stat} {name} (ms):", "-" if v is None else f"{v:.2f}")
                                         for stat, v in (("Mean", summary.mean), ("Median", summary.p50),
                                                         ("P99", summary.p99))]
    if lv.accept_length is not None or lv.accept_length_spec is not None:
        lines.append(_rule("Speculative Decoding", "-"))
        if lv.accept_length is not None:
            lines.append(_line("Acceptance length:", f"{lv.accept_length:.2f}"))
        if lv.accept_length_spec is not None:
            lines.append(_line("Acceptance length (speculative steps):", f"{lv.accept_length_spec:.2f}"))
    lines.append("=" * 50)
    return lines


def bench_lines(result: BenchResult, *, color: bool, width: int | None) -> list[str]:
    """The lines ``bench`` prints: the server, the levels' table (split to fit ``width``; None:
    piped, one table), the footnotes, the errors and what was in flight."""
    server = result.server
    about = " ".join(safe(x) for x in (server.get("engine"), server.get("version")) if x)
    engine = f" ({about})" if server.get("engine") else ""
    model = safe(result.model or "?")
    head = (f"{model} at {safe(result.url)}{engine}, {result.api}" + ("" if result.plan.stream else ", not streamed")
            + (", interrupted: levels marked * were cut short" if result.interrupted else ""))
    lines = wrapped([head], width)
    lines[0] = paint(model, ("bold",), color) + lines[0][len(model):]
    for lv in result.levels:
        lines += summary_block(lv) + [""]
    scale = server.get("time_scale")  # a simulated server says it (sim serve --time-scale)
    if isinstance(scale, (int, float)) and not isinstance(scale, bool) and scale != 1:
        lines += [paint(x, ("yellow",), color) for x in wrapped([
            f"scaled figures: the server simulates its model {scale:g}x faster than modelled (--time-scale "
            f"{scale:g}): throughputs are {scale:g}x, latencies 1/{scale:g} of the model's"], width)]
    goodput = bool(result.plan.goodput)
    # the one table style of every command: bold Title Case headers, no borders (units stay as written)
    names = ["Conc", "Done", "Fail", "Req/s", "Out tok/s", "Peak tok/s", "In flight", "Accept", "Spec steps"] \
        + (["Goodput"] if goodput else []) + ["TTFT ms", "TPOT ms", "ITL ms", "Chunk gap ms", "E2E ms"]
    columns = [Column(n, "right") for n in names]
    rows: list[list[Cell]] = []
    for lv in result.levels:
        est = "~" if lv.tokens_estimated else ""
        row = [
            Cell(level_label(lv), ("yellow",) if lv.interrupted else ()), Cell(str(lv.completed)),
            Cell(str(lv.failed), ("red",) if lv.failed else ()), Cell(f"{lv.request_throughput:.2f}"),
            Cell(f"{lv.output_token_throughput:.1f}{est}"), Cell(f"{lv.peak_output_token_throughput:.0f}{est}"),
            Cell(f"{lv.achieved_concurrency:.1f}"), Cell(_accept(lv)),
            Cell("-" if lv.spec_step_share is None else f"{lv.spec_step_share:.0%}")]
        if goodput:
            row.append(Cell("-" if lv.goodput is None else f"{lv.goodput:.2f} ({lv.slo_attainment:.0%})"))
        row += [Cell(_pair(x)) for x in (lv.ttft_ms, lv.tpot_ms, lv.itl_ms, lv.chunk_gap_ms, lv.e2e_ms)]
        rows.append(row)
    if rows:
        lines += tables(columns, rows, color=color, width=width)
    foot = ["latencies: median / p99", _connection_note(result.plan.connection),
            "ITL per token (SGLang), chunk gap between streamed chunks",
            "in flight: achieved concurrency", "accept: tokens per request-step over all steps",
            "peak: the most output tokens in one second"]
    if any(lv.accept_length is None and lv.accept_length_spec is not None for lv in result.levels):
        foot.append("ˢ over speculative steps only")
    if any(lv.tokens_estimated for lv in result.levels):
        foot.append("~ ESTIMATED: no usage reported and no --tokenizer")
    if any(lv.warming for lv in result.levels):
        foot.append("! the server was still warming up")
    if result.interrupted:
        foot.append("* cut short by an interrupt")
    if goodput:
        foot.append("goodput: req/s meeting " + ", ".join(f"{k.value} ≤ {v:g} ms" for k, v in result.plan.goodput)
                    + " (share of completed)")
    lines += [paint(x, ("dim",), color) for x in wrapped(foot, width)]
    for lv in result.levels:
        label = lv.concurrency if lv.concurrency is not None else "rate"
        for message, count in lv.errors.items():
            lines.append(paint(f"c={label}: {count} × {safe(message)}", ("red",), color))
        if lv.not_sent:
            lines.append(f"c={label}: {lv.not_sent} request(s) not sent"
                         + (f" ({safe(lv.stopped_early)})" if lv.stopped_early else ""))
    if result.in_flight:
        lines.append(f"in flight when interrupted: {len(result.in_flight)} request(s)")
        for r in result.in_flight[:20]:
            where = f"c={r.get('concurrency')}" if r.get("concurrency") is not None else f"level {r.get('level')}"
            lines.append(f"  {where}{' warm-up' if r.get('warmup') else ''}: {_num(r.get('elapsed_s')):.2f} s, "
                         f"{safe(r.get('chunks_received'))} chunk(s) received")
        if len(result.in_flight) > 20:
            lines.append(f"  ... and {len(result.in_flight) - 20} more")
    return lines


def _num(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) else 0.0


def print_bench(result: BenchResult) -> None:
    out = sys.stdout
    out.write("\n".join(bench_lines(result, color=use_color(out), width=width_of(out))) + "\n")
    out.flush()
