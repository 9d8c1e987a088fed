"""The output of ``experiment run`` and ``experiment report``, here or from another host's document
(see :mod:`.results`): all of it from the ``gpuslate.experiment.v1`` document the report carries."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .plain import safe as escape

if TYPE_CHECKING:
    from ..bench.report import DemoResult, Report


def print_report(rep: Report) -> None:
    """The report, here or from another host's document: all of it from the document (``summary``)."""
    from ..bench.report import (  # lazy: startup
        apply_lines,
        level_tables,
        order_sentence,
        time_scale_sentence,
        verification_lines,
        verification_sentence,
    )

    s = rep.summary
    out = Path(s["dir"])
    pts = s["points"]
    print(f"Experiment {s['name']}: {pts['done']}/{pts['total']} points"
          + ("" if s["complete"] else " (incomplete)") + f", in {out}")
    print(order_sentence(s))
    if s["time_scale"] != 1:
        print(time_scale_sentence(s["time_scale"]))
    for c, table in level_tables(s["levels"]):
        print(f"\nconcurrency {c}")
        # cells are figures and deployment names (checked like unit names): nothing to escape
        widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
        for row in table:
            print("  " + "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                                   for i, (cell, w) in enumerate(zip(row, widths))))
    for c in s.get("threshold_check") or []:
        if c == (s.get("threshold_check") or [])[0]:
            print("\nwith the threshold against the better of the two (ratio, interval):")
        print(f"  c={c['concurrency']}: {c['ratio']:.3f} in [{c['interval'][0]:.3f}, {c['interval'][1]:.3f}]: "
              f"{c['verdict']}")
    rec = s.get("recommendation")
    if rec is not None:
        print(f"\nRecommendation: {rec['summary']}")
        if rec.get("next"):
            print(f"  {rec['next']}")
        if rec.get("apply"):
            # engine-facing text from the server and the spec: escaped (a command may carry anything)
            for line in apply_lines(rec["apply"], [str(out / f) for f in s.get("files", {}).get("engines", [])]):
                print(f"  {escape(line)}")
        for w in rec["warnings"]:
            print(f"  warning: {w}")
    elif s.get("recommendation_note"):
        print(f"\n{s['recommendation_note']}")
    ver = s.get("verification")
    if ver is not None:
        print("\nThe recommendation's own run: " + escape(verification_sentence(ver)).replace("**", ""))
        for row in verification_lines(ver):
            print(f"  c={row[0]}: {row[1]} tok/s vs {row[2]} ({row[3]}): {row[4]} in {row[5]}: {row[6]}")
        for n in ver.get("notes", []):
            print(f"  note: {escape(n)}")
    elif s.get("verification_note"):
        print(f"\n{escape(s['verification_note'])}")
    files = s.get("files", {})
    print(f"\nReport: {out / 'report.md'}" + (f" ({len(files.get('plots', []))} plots)" if files.get("plots") else ""))
    if s.get("plots_note"):
        print(f"  {s['plots_note']}")


def show_demo(result: DemoResult) -> None:
    """``demo``: its experiment's report, then the clean-slate check."""
    clean = result.clean
    print_report(result.experiment)
    print(f"\nVerified clean: {clean['gpus_free']}/{clean['gpus']} GPUs free, "
          f"{clean['units_running']} unit(s) running; {result.elapsed_s:.0f} s in all.")
