"""The table of ``gpuslate bench`` for people (rich). ``--json`` never comes through here.

Latencies show the median and p99 (the JSON has mean, std, max and every
percentile asked for); the table is as wide as its values, never cut to the
terminal's 80 columns when piped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .render import console

if TYPE_CHECKING:
    from ..bench import BenchResult
    from ..bench.metrics import LevelResult, Summary


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


def print_bench(result: BenchResult) -> None:
    from rich.markup import escape  # lazy: startup
    from rich.measure import Measurement  # lazy: startup
    from rich.table import Table  # lazy: startup

    con = console()
    server = result.server
    engine = f" ({escape(str(server.get('engine')))} {escape(str(server.get('version') or ''))})".rstrip() \
        if server.get("engine") else ""
    con.print(f"[bold]{escape(result.model or '?')}[/] at {escape(result.url)}{engine}, {result.api}"
              f"{'' if result.plan.stream else ', not streamed'}", soft_wrap=True)
    goodput = bool(result.plan.goodput)
    table = Table(box=None, pad_edge=False, header_style="bold")
    # the one table style of every command: bold Title Case headers, no borders (units stay as written)
    names = ["Conc", "Done", "Fail", "Req/s", "Out tok/s", "Peak tok/s", "TTFT ms", "TPOT ms", "ITL ms",
             "Chunk gap ms", "E2E ms", "In flight", "Accept", "Spec steps"] + (["Goodput"] if goodput else [])
    for name in names:
        table.add_column(name, justify="right", no_wrap=True)
    for lv in result.levels:
        conc = str(lv.concurrency) if lv.concurrency is not None else (
            f"{lv.request_rate:g}/s" + (f" ≤{lv.max_concurrency}" if lv.max_concurrency else ""))
        est = "~" if lv.tokens_estimated else ""
        row = [
            conc + ("*" if lv.interrupted else "") + ("!" if lv.warming else ""), str(lv.completed),
            f"[red]{lv.failed}[/]" if lv.failed else "0",
            f"{lv.request_throughput:.2f}",
            f"{lv.output_token_throughput:.1f}{est}", f"{lv.peak_output_token_throughput:.0f}{est}",
            _pair(lv.ttft_ms), _pair(lv.tpot_ms), _pair(lv.itl_ms), _pair(lv.chunk_gap_ms), _pair(lv.e2e_ms),
            f"{lv.achieved_concurrency:.1f}", _accept(lv),
            "-" if lv.spec_step_share is None else f"{lv.spec_step_share:.0%}"]
        if goodput:
            row.append("-" if lv.goodput is None else f"{lv.goodput:.2f} ({lv.slo_attainment:.0%})")
        table.add_row(*row)
    width = max(con.width, Measurement.get(con, con.options, table).maximum)
    con.print(table, width=width)
    foot = ["latencies: median / p99", "ITL per token (SGLang), chunk gap between streamed chunks",
            "in flight: achieved concurrency", "accept: tokens per request-step over all steps"]
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
    con.print("[dim]" + "; ".join(foot) + "[/]", soft_wrap=True)
    for lv in result.levels:
        label = lv.concurrency if lv.concurrency is not None else "rate"
        for message, count in lv.errors.items():
            con.print(f"[red]c={label}: {count} × {escape(message)}[/]", soft_wrap=True)
        if lv.not_sent:
            con.print(f"c={label}: {lv.not_sent} request(s) not sent"
                      + (f" ({escape(lv.stopped_early)})" if lv.stopped_early else ""), soft_wrap=True)
    if result.in_flight:
        con.print(f"in flight when interrupted: {len(result.in_flight)} request(s)", soft_wrap=True)
        for r in result.in_flight[:20]:
            where = f"c={r.get('concurrency')}" if r.get("concurrency") is not None else f"level {r.get('level')}"
            con.print(f"  {where}{' warm-up' if r.get('warmup') else ''}: {r['elapsed_s']:.2f} s, "
                      f"{r['chunks_received']} chunk(s) received", soft_wrap=True)
        if len(result.in_flight) > 20:
            con.print(f"  ... and {len(result.in_flight) - 20} more", soft_wrap=True)
