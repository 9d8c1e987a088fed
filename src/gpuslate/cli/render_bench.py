"""The table of ``gpuslate bench`` for people (rich). ``--json`` never comes through here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .render import console

if TYPE_CHECKING:
    from ..bench import BenchResult
    from ..bench.metrics import Summary


def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def _pair(s: Summary) -> str:
    return f"{_ms(s.mean)} / {_ms(s.p99)}"


def print_bench(result: BenchResult) -> None:
    from rich.markup import escape
    from rich.table import Table

    con = console()
    server = result.server
    engine = f" ({escape(str(server.get('engine')))} {escape(str(server.get('version') or ''))})".rstrip() \
        if server.get("engine") else ""
    con.print(f"[bold]{escape(result.model)}[/] at {escape(result.url)}{engine}, {result.api}"
              f"{'' if result.plan.stream else ', not streamed'}")
    table = Table(box=None, pad_edge=False, header_style="bold")
    for name in ("conc", "done", "fail", "req/s", "out tok/s", "tot tok/s", "TTFT ms", "TPOT ms",
                 "ITL ms", "E2E ms", "in flight", "accept"):
        table.add_column(name, justify="right")
    for lv in result.levels:
        conc = str(lv.concurrency) if lv.concurrency is not None else (
            f"{lv.request_rate:g}/s" + (f" ≤{lv.max_concurrency}" if lv.max_concurrency else ""))
        table.add_row(
            conc + ("*" if lv.interrupted else ""), str(lv.completed),
            f"[red]{lv.failed}[/]" if lv.failed else "0",
            f"{lv.request_throughput:.2f}",
            f"{lv.output_token_throughput:.1f}" + ("~" if lv.tokens_estimated else ""),
            f"{lv.total_token_throughput:.1f}" + ("~" if lv.tokens_estimated else ""),
            _pair(lv.ttft_ms), _pair(lv.tpot_ms), _pair(lv.itl_ms), _pair(lv.e2e_ms),
            f"{lv.achieved_concurrency:.1f}",
            "-" if lv.accept_length is None else f"{lv.accept_length:.2f}")
    con.print(table)
    con.print("[dim]latencies: mean / p99; in flight: achieved concurrency"
              + ("; ~ estimated from streamed chunks (no usage reported)"
                 if any(lv.tokens_estimated for lv in result.levels) else "")
              + ("; * cut short by Ctrl-C" if result.interrupted else "") + "[/]")
    for lv in result.levels:
        for message, count in lv.errors.items():
            label = lv.concurrency if lv.concurrency is not None else "rate"
            con.print(f"[red]c={label}: {count} × {escape(message)}[/]")
