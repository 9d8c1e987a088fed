"""The output of ``experiment run`` and ``experiment report``, here or from another host's document
(see :mod:`.results`): all of it from the ``gpuslate.experiment.v1`` document the report carries."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..bench.report import DemoResult, Report


def print_report(rep: Report) -> None:
    """The report, here or from another host's document: all of it from the document (``summary``)."""
    from ..bench.report import level_tables, order_sentence, time_scale_sentence  # lazy: startup
    from ..bench.threshold import engine_lines  # lazy: startup

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
        engines = rec["engines"]
        print(f"\nRecommendation: {rec['summary']}")
        for line in engine_lines(rec["threshold"], engines["sglang_adaptive_config"],
                                 engines["vllm_speculative_config"]["num_speculative_tokens_per_batch_size"]):
            print(f"  {line}")
        for w in rec["warnings"]:
            print(f"  warning: {w}")
        if s.get("files", {}).get("engines"):
            print(f"  files: {', '.join(str(out / f) for f in s['files']['engines'])}")
    elif s.get("recommendation_note"):
        print(f"\n{s['recommendation_note']}")
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
