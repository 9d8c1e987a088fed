"""``gpuslate experiment run SPEC.toml [--out DIR] [--resume]`` and ``gpuslate experiment report DIR``."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from ...errors import Interrupted, UsageError
from ...extras import Extra, install_hint, missing, require
from ..exits import ExitStatus, exit_epilog, exit_status_for_result
from ..render.output import Mode, OutputLost, set_mode
from ..render.plain import cut
from . import present
from .common import add_common, confirm_plan, describe, note, print_error, stdin_is_terminal, with_examples

if TYPE_CHECKING:
    from ...bench.experiment import ExperimentProgress, RunResult
    from ...bench.report import Report


RUN_EPILOG = exit_epilog({
    0: "every point ran and no request failed",
    2: "bad spec or --out, or the bench extra not installed (nothing was started)",
    4: "a deployment could not be stopped with its GPUs verified free",
    6: "a deployment did not come up, or no request succeeded",
    7: "some requests failed (grouped in DIR/points)",
    130: "interrupted by Ctrl-C: units stopped and verified, points kept (--resume continues)",
    141: "stdout or stderr went away (a closed pipe, e.g. '2>&1 | head'): likewise",
    143: "terminated by SIGTERM: likewise"})


def build(p: argparse.ArgumentParser) -> None:
    """Its options (the parser is made from its row of the command table, with its summary)."""
    describe(p, examples=[("run the spec's matrix, then write its report",
                           "gpuslate experiment run spec.toml --out results"),
                         ("go on with an interrupted run", "gpuslate experiment run spec.toml --out results --resume"),
                         ("write the report again", "gpuslate experiment report results")],
             description="A/B experiments between deployments (e.g. a baseline and a speculative-"
                       "decoding server): each swapped in on a verified clean slate, swept over concurrency "
                       "levels and repeats with the load generator of 'gpuslate bench' in an order that "
                       "exposes drift, compared with intervals, and a speculation disable threshold "
                       "recommended. See docs/experiment.md.", epilog=RUN_EPILOG)
    add_common(p)
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    r = verbs.add_parser("run", help="run (or --resume) an experiment spec",
                         description="Run the experiment of SPEC.toml into DIR: every finished point is "
                         "written at once, so an interrupted run loses nothing and --resume skips what is done. "
                         "The report is written at the end.", epilog=RUN_EPILOG)
    r.epilog = with_examples([
        ("run the spec's matrix into results/, then write its report",
         "gpuslate experiment run spec.toml --out results"),
        ("go on with an interrupted run (finished points are kept)",
         "gpuslate experiment run spec.toml --out results --resume"),
        ("a spec that clears the GPUs first (clear = true), run from a script",
         "gpuslate experiment run spec.toml --yes")], r.epilog)
    add_common(r)
    r.add_argument("spec", metavar="SPEC.toml")
    r.add_argument("--out", metavar="DIR", help="results folder (default: ./experiments/NAME)")
    r.add_argument("--resume", action="store_true", help="continue the experiment in DIR, skipping finished points")
    r.add_argument("-y", "--yes", action="store_true",
                   help="go ahead without asking when the spec clears the GPUs first (clear = true); needed then "
                   "when stdin is not a terminal")
    r.set_defaults(handler=run)
    rep = verbs.add_parser("report", help="(re)write the report of an experiment folder",
                           description="Aggregate DIR's points: a table per concurrency level, PNG plots, "
                           "report.md, summary.json and summary.csv, the speculation recommendation and, when "
                           "its engine can apply it, the files and command line that do (read from the "
                           "speculative deployment's own command by its engine's rules: the engine's own "
                           "files, and recommended-command.txt).",
                           epilog=exit_epilog({0: "report written",
                                               2: "DIR is not an experiment folder, or the bench extra not installed"},
                                              backend=False))
    rep.epilog = with_examples([
        ("the tables, plots, report.md and recommendation of results/ again",
         "gpuslate experiment report results")], rep.epilog)
    rep.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                     help="print the versioned JSON document instead of a table")
    rep.add_argument("dir", metavar="DIR")
    rep.set_defaults(handler=report)
    p.set_defaults(handler=lambda args: _usage(p))


def _usage(p: argparse.ArgumentParser) -> int:
    sys.stderr.write("gpuslate: error: experiment needs a verb: run SPEC.toml or report DIR "
                     "(see 'gpuslate experiment --help')\n")
    return ExitStatus.USAGE


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C but leaving with 143."""


def interrupted_status(exc: Interrupted, json_out: bool, message: str | None = None) -> int:
    """Report an interrupted run; 143 when SIGTERM caused it, 141 when its output went away
    (cli/render/output.py: said on stderr if stderr still works), else 130."""
    cause = exc.__context__
    shown = exc if message is None else Interrupted(message)
    if isinstance(cause, Terminated):
        status = ExitStatus.TERMINATED
        shown = Interrupted(str(shown).replace("interrupted", "terminated", 1), hint=shown.hint)
    elif isinstance(cause, OutputLost):
        status = ExitStatus.OUTPUT_LOST
        shown = Interrupted(str(shown).replace("interrupted", f"stopped: {cause}", 1), hint=shown.hint)
    else:
        status = ExitStatus.INTERRUPTED
    print_error(shown, status, json_out)
    return status


def sigterm_as_interrupt() -> None:
    """SIGTERM ends a run like Ctrl-C: units stopped and verified, exit 143."""
    def raise_interrupt(signum: int, frame: Any) -> NoReturn:
        raise Terminated("terminated")

    signal.signal(signal.SIGTERM, raise_interrupt)


def run(args: argparse.Namespace) -> int:
    require("experiment run", Extra.BENCH)  # the load generator: before anything is started
    from ...api import Host  # lazy: startup
    from ...bench.experiment import run_experiment  # lazy: startup
    from ...bench.spec import load_spec  # lazy: startup

    spec = load_spec(args.spec)  # a malformed spec: exit 2 before anything starts
    confirm = None
    if spec.clear_first and not args.yes:  # its clear ends processes the spec does not name: consent first
        if not stdin_is_terminal():
            raise UsageError("the spec clears the GPUs first (clear = true), which ends processes it does not name, "
                             "but stdin is not a terminal to ask on: add --yes to go ahead (nothing was started "
                             "or signaled)")
        confirm = confirm_plan
    if missing(Extra.PLOTS):  # the run goes on; only the report's PNG plots need matplotlib
        note(f"matplotlib is not installed: the report will have no plots; {install_hint(Extra.PLOTS)}")
    out = Path(args.out) if args.out else Path("experiments") / spec.name
    sigterm_as_interrupt()
    display = ProgressDisplay(spec.time_scale)
    display.say_scale()
    try:
        with Host.open(getattr(args, "sim", None), on_event=display.note) as host:  # the run's one context
            result = run_experiment(host, spec, out, resume=args.resume, on_progress=display.update,
                                    confirm=confirm)
    except Interrupted as exc:
        display.close()
        return interrupted_status(exc, args.json)
    finally:
        display.close()
    set_mode(Mode.ACT)  # every point ran: the report is written whatever happens to the output now
    display.note(f"{result.points_run} point(s) run, {result.points_skipped} resumed, "
                 f"in {result.elapsed_s:.1f} s; writing the report")
    rep = write_report_for(out)
    rep.run = run_json(result)
    shown = present(args, rep)
    outcome(rep)
    return shown


def outcome(rep: Report) -> int:
    """By the report's status: 0; 7 when some requests failed (grouped in the points); 6 when no
    request succeeded at all."""
    from ...bench.report import ExperimentStatus  # lazy: startup

    status = rep.status
    if status == ExperimentStatus.FAILED:
        note("error: no request succeeded (see the errors in DIR/points/*.json)")
    elif status == ExperimentStatus.PARTIAL:
        note(f"{rep.failed_requests} request(s) failed (see the errors in DIR/points/*.json)")
    return exit_status_for_result(status)


def report(args: argparse.Namespace) -> int:
    rep = write_report_for(Path(args.dir))
    return present(args, rep)


def write_report_for(out: Path) -> Report:
    from ...bench.report import write_report  # lazy: startup

    return write_report(out)


def run_json(result: RunResult) -> dict[str, Any]:
    return {"points_run": result.points_run, "points_skipped": result.points_skipped,
            "elapsed_s": round(result.elapsed_s, 3),
            "transitions": [{"deployment": t["deployment"], "action": t["action"], "at": t["at"], "ok": t["ok"],
                             "total_s": t["result"].get("total_s", t["result"].get("timings", {}).get("total_s"))}
                            for t in result.transitions]}


def _points(p: ExperimentProgress) -> str:
    """``5/36``; ``5/~36`` while the total holds the verification's points estimated, before it is planned."""
    return f"{p.points_done}/{'~' if p.total_estimated else ''}{p.points_total}"


class ProgressDisplay:
    """Deployment, level, requests done, elapsed and remaining: a live line on a terminal
    (stderr) whose remaining time counts down between updates; otherwise one line per
    finished point, with its throughput. Notes from the units API go above it."""

    def __init__(self, time_scale: float = 1.0) -> None:
        self.live: Any = None
        self.current: ExperimentProgress | None = None
        self.key: tuple[Any, ...] | None = None
        # the one throughput figure of a run: in modelled time, as the report shows it (a simulated
        # server at --time-scale S serves S times the modelled tok/s); said once, here
        self.time_scale = time_scale
        if sys.stderr.isatty():
            from rich.console import Console  # lazy: startup
            from rich.live import Live  # lazy: startup

            self.live = Live(_Line(self), console=Console(file=sys.stderr), transient=True, refresh_per_second=4)
            self.live.start()

    def say_scale(self) -> None:
        """What the throughputs of a time-scaled run are, once, before the first of them."""
        if self.time_scale != 1:
            self.note(f"throughputs are in modelled time, as in the report: the simulated servers run "
                      f"{self.time_scale:g}x faster, and what they serve is divided by {self.time_scale:g}")

    def note(self, msg: str) -> None:
        if self.live is not None:
            from rich.markup import escape  # lazy: startup

            self.live.console.print(f"gpuslate: {escape(msg)}", highlight=False)
        else:
            note(msg)

    def line(self, width: int | None = None) -> str:
        """The live line; on a terminal of ``width`` columns, said shorter where it would not fit (a
        line the terminal wraps is drawn again under itself at every refresh): the deployment and the
        level always, whole."""
        p = self.current
        if p is None:
            return ""
        remaining = None if p.eta_at is None else max(0.0, p.eta_at - time.monotonic())
        level = p.concurrency is not None and p.repeat is not None
        what = ("control" if p.control else f"repeat {(p.repeat or 0) + 1}") if level else ""
        count = f"{p.done}/{p.total}" if p.total is not None else f"{p.done}"  # a level bounded by time: no total
        running = p.phase in ("warmup", "running")
        left = f", ~{_dur(remaining)} left" if remaining is not None else ""
        where = f"{p.deployment} ({p.deployment_index + 1}/{p.deployments})" + (
            f" c={p.concurrency} {what}" if level else "")
        reqs = f" {p.phase} {count} requests" if running else f" {p.phase}"
        text = f"{where}:{reqs} | points {_points(p)} | {_dur(p.elapsed_s)} elapsed{left}"
        if width is None or len(text) < width:
            return text
        short = f"{p.deployment}" + (f" c={p.concurrency} {'ctl' if p.control else f'r{(p.repeat or 0) + 1}'}"
                                      if level else "")
        reqs = f"{'warm-up ' if p.phase == 'warmup' else ''}{count} req" if running else p.phase
        when = f"~{_dur(remaining)} left" if remaining is not None else _dur(p.elapsed_s)
        points = f"{_points(p)} pts"
        for text in (f"{short}: {reqs} | {points} | {when}", f"{short} | {points} | {when}"):
            if len(text) < width:
                break
        return cut(text, width - 1)

    def update(self, p: ExperimentProgress) -> None:
        key = (p.deployment, p.concurrency, p.repeat, p.phase)
        changed, self.current, self.key = key != self.key, p, key
        if self.live is not None:
            if changed:
                self.live.refresh()  # every point drawn at least once; the ETA then counts down by itself
            return
        if p.phase == "finished":  # piped: one line per finished point
            left = f", ~{_dur(p.remaining_s)} left" if p.remaining_s is not None else ""
            what = "control" if p.control else f"repeat {(p.repeat or 0) + 1}"
            tok = f"{p.output_tok_s / self.time_scale:.1f} tok/s" if p.output_tok_s is not None else "done"
            note(f"{p.deployment} c={p.concurrency} {what}: {tok} ({p.done} requests) | points "
                 f"{_points(p)} | {_dur(p.elapsed_s)} elapsed{left}")
        elif p.phase == "starting":
            note(f"{p.deployment} ({p.deployment_index + 1}/{p.deployments}): starting")

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None


class _Line:
    """A rich renderable that asks the display for its line at every refresh (so the ETA moves)."""

    def __init__(self, display: ProgressDisplay) -> None:
        self.display = display

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from rich.text import Text  # lazy: startup

        yield Text(self.display.line(options.max_width))  # plain text: no markup, no highlighting


def _dur(s: float | None) -> str:
    if s is None:
        return "?"
    s = round(s)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
