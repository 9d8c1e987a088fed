"""The output of ``experiment run`` and ``experiment report``, here or from another host's document
(see :mod:`.results`): all of it from the ``gpuslate.experiment.v1`` document the report carries."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .plain import Cell, Column, tables, use_color, width_of
from .plain import safe as escape

if TYPE_CHECKING:
    from ...bench.report import DemoResult, Report


def _say(width: int | None) -> Callable[[str], None]:
    """``print`` for the report's sentences: on a terminal, wrapped at its width (at spaces, the
    next lines indented as the first one and two more); piped, one line each."""
    def say(text: str = "") -> None:
        lead = text[: len(text) - len(text.lstrip(" \n"))]
        if width is None or len(text) <= width:
            print(text)
            return
        import textwrap  # lazy: startup

        indent = lead.lstrip("\n")
        print(lead[: len(lead) - len(indent)] + "\n".join(textwrap.wrap(
            text.lstrip(" \n"), width, initial_indent=indent, subsequent_indent=indent + "  ",
            break_on_hyphens=False, break_long_words=False)))

    return say


def print_report(rep: Report) -> None:
    """The report, here or from another host's document: all of it from the document (``summary``)."""
    from ...bench.report import (  # lazy: startup
        apply_lines,
        emulated_sentence,
        level_tables,
        order_sentence,
        switch_lines,
        switch_sentence,
        time_scale_sentence,
        verification_lines,
        verification_sentence,
    )

    width = width_of(sys.stdout)
    say = _say(width)
    s = rep.summary
    out = Path(s["dir"])
    pts = s["points"]
    say(f"Experiment {s['name']}: {pts['done']}/{pts['total']} points"
          + ("" if s["complete"] else " (incomplete)") + f", in {out}")
    say(order_sentence(s))
    if s["time_scale"] != 1:
        say(time_scale_sentence(s["time_scale"]))
    emulated = emulated_sentence(s)
    if emulated:
        say(escape(emulated))
    for c, table in level_tables(s["levels"]):
        say(f"\nconcurrency {c}")
        # cells are figures and deployment names (checked like unit names): nothing to escape; on a
        # narrow terminal, several tables one under the other, each naming the deployment
        columns = [Column(h, "left" if i == 0 else "right") for i, h in enumerate(table[0])]
        rows = [[Cell(x) for x in row] for row in table[1:]]
        for line in tables(columns, rows, color=use_color(sys.stdout), width=width - 2 if width else None):
            print("  " + line if line else "")
    for c in s.get("threshold_check") or []:
        if c == (s.get("threshold_check") or [])[0]:
            say("\nwith the threshold against the better of the two (ratio, interval):")
        say(f"  c={c['concurrency']}: {c['ratio']:.3f} in [{c['interval'][0]:.3f}, {c['interval'][1]:.3f}]: "
            f"{c['verdict']}")
    rec = s.get("recommendation")
    if rec is not None:
        say(f"\nRecommendation: {rec['summary']}")
        if rec.get("next"):
            say(f"  {rec['next']}")
        if rec.get("apply"):
            # engine-facing text from the server and the spec: escaped (a command may carry anything)
            for line in apply_lines(rec["apply"], [str(out / f) for f in s.get("files", {}).get("engines", [])]):
                if line.startswith("Command line: "):
                    print(f"  {escape(line)}")  # a command line to copy: never broken
                else:
                    say(f"  {escape(line)}")
        for w in rec["warnings"]:
            say(f"  warning: {w}")
    elif s.get("recommendation_note"):
        say(f"\n{s['recommendation_note']}")
    ver = s.get("verification")
    if ver is not None:
        say("\nThe recommendation's own run: " + escape(verification_sentence(ver)).replace("**", ""))
        for row in verification_lines(ver):
            say(f"  c={row[0]}: {row[1]} tok/s vs {row[2]} ({row[3]}): {row[4]} in {row[5]}: {row[6]}")
        if ver.get("switch"):
            say("  " + escape(switch_sentence(ver)).replace("**", ""))
            for row in switch_lines(ver):
                say(f"  c={row[0]}: {row[1]} tok/s vs the worse of the two {row[4]} (baseline {row[2]}, "
                    f"speculative {row[3]}): {row[5]} in {row[6]}: {row[7]}")
        for n in ver.get("notes", []):
            say(f"  note: {escape(n)}")
    elif s.get("verification_note"):
        say(f"\n{escape(s['verification_note'])}")
    files = s.get("files", {})
    say(f"\nReport: {out / 'report.md'}" + (f" ({len(files.get('plots', []))} plots)" if files.get("plots") else ""))
    if s.get("plots_note"):
        say(f"  {s['plots_note']}")


def show_demo(result: DemoResult) -> None:
    """``demo``: its experiment's report, then the clean-slate check."""
    clean = result.clean
    print_report(result.experiment)
    n = clean["units_running"]
    units = "no unit" if n == 0 else f"{n} unit{'s' if n != 1 else ''}"
    print(f"\nVerified clean: {clean['gpus_free']}/{clean['gpus']} GPUs free, "
          f"{units} running; {result.elapsed_s:.0f} s in all.")
