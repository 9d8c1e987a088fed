"""What ``up``, ``down``, ``swap``, ``restart``, ``rm`` and ``ps`` print (and ``up``/``down``/``restart`` of
several units): one renderer per result type, for a local run
and for another host's document read back (``--host``) alike.

Each ``show_*`` takes the result as its document gives it back (see :func:`gpuslate.cli.commands.present`): what is
printed is exactly what travels, so a command prints the same bytes here and over ``--host``.
The result goes to stdout; a failure's story (the log tail, why) to stderr, with ``--json`` too.
Plain text, no rich: the tables are laid out by :mod:`.plain`, like ``status``.
"""

from __future__ import annotations

import sys
from typing import IO

from ..._parse import format_gpu_list, format_size, gpus_phrase
from ..._time import format_duration
from ...units.batch import BatchResult
from ...units.frontreport import FrontReport, FrontState
from ...units.lifecycle import DownResult, UpResult
from ...units.listing import PsResult
from ...units.park import ParkResult, ResumeResult
from ...units.remove import RmResult
from ...units.restart import RestartResult
from ...units.stop import StopReport, Verification
from ...units.swap import SwapResult, SwapStatus
from ...units.unitfile import ConfigResult, toml_text
from .plain import Cell, Column, folded, safe, table, tables, use_color, width_of

_PS_COLUMNS = (Column("Name"), Column("State"), Column("PID", "right"), Column("Uptime", "right"),
               Column("Port", "right"), Column("GPUs"), Column("GPU memory", "right"), Column("Ready in", "right"))
_PHASES = (("lock_wait_s", "wait for the host lock"), ("prefetch_wait_s", "prefetch {new} (old serves)"),
           ("drain_old_s", "drain {old} (front holds)"),
           ("park_old_s", "park {old}"), ("prove_old_s", "prove {old} parked (NVML)"),
           ("stop_old_s", "stop {old}"), ("verify_clean_s", "verify GPUs clean"),
           ("resume_new_s", "resume {new}"), ("back_new_s", "{new}'s memory back (NVML)"),
           ("serve_new_s", "{new} serves again"), ("warmup_new_s", "warm-up completion"),
           ("reference_new_s", "{new}'s reference answer"),
           ("preflight_new_s", "pre-flight {new}"),
           ("launch_new_s", "launch {new}"), ("ready_new_s", "{new} ready"), ("smoke_new_s", "smoke completion"),
           ("rollback_s", "rollback to {old}"))
_DOWNTIME = (("park_old_s", "park {old}"), ("prove_old_s", "prove {old} parked"),
             ("stop_old_s", "stop {old}"), ("verify_clean_s", "verify GPUs clean"),
             ("resume_new_s", "resume {new}"), ("back_new_s", "memory back"), ("serve_new_s", "serves again"),
             ("warmup_new_s", "warm-up"), ("reference_new_s", "reference answer"),
             ("preflight_new_s", "pre-flight {new}"), ("spawn_new_s", "spawn {new}"),
             ("start_to_port_open_s", "process start -> port open"), ("port_open_to_ready_s", "port open -> ready"),
             ("smoke_new_s", "smoke completion"))


def gpu_text(gpus: list[int]) -> str:
    """A unit's GPUs as every command prints GPU lists (``0,2-3``); ``-`` for none."""
    return format_gpu_list(gpus) or "-"


def _out(line: str = "", file: IO[str] | None = None) -> None:
    (file or sys.stdout).write(line + "\n")


def _say(line: str) -> None:
    """A sentence on stdout, broken at spaces where the terminal is narrower (a PID or a GPU list
    is never split by the terminal's own wrapping)."""
    _out(folded(line, width_of(sys.stdout)))


# -- up ------------------------------------------------------------------------------------------

def print_up(result: UpResult) -> None:
    """A ready unit: one line, its readiness and its log."""
    r = result.record
    line = (f"Unit {safe(r.name)} ready in {r.time_to_ready_s or 0:.2f} s: pid {r.pid}, {gpus_phrase(r.gpus)}, "
            f"port {r.port if r.port is not None else '-'}, {safe(r.containment)}")
    if result.smoke:
        line += f", smoke completion {result.smoke['latency_s']:.3f} s"
    _say(line)
    _say(f"  readiness: {safe(result.readiness['kind'])} ({safe(result.readiness['detail'])})")
    _out(f"  log: {safe(r.log)}")


def report_up_failure(result: UpResult) -> None:
    """A unit that failed: the log tail (the server's own output, as it wrote it, like ``logs``) and
    one error line, on stderr (nothing for one that is ready)."""
    if result.ok:
        return
    r, err = result.record, sys.stderr
    if result.log_tail:
        err.write(f"--- last {len(result.log_tail)} lines of {safe(r.log)} ---\n")
        err.write("\n".join(result.log_tail) + "\n---\n")
    err.write(f"gpuslate: error: unit {safe(r.name)} failed: {safe(r.failure)}\n")
    t = result.teardown
    if t is not None:
        left = (memory_text(t) if t.released is None or t.verification == Verification.NOT_RULED_OUT else
                "GPUs verified clean" if t.ok else "NOT clean: " + safe("; ".join(d.summary() for d in t.diagnosis)))
        err.write(f"gpuslate: stopped what it left running; {left}\n")


def show_up(result: UpResult) -> None:
    if result.ok:
        print_up(result)
    else:
        report_up_failure(result)
    print_front(result.front)


# -- down ----------------------------------------------------------------------------------------

def memory_text(rep: StopReport) -> str:
    """What the stop proved about GPU memory: released or not, on which GPUs; or why nothing was
    verified (never "released" for an empty set, nor while a process not ruled out holds GPU
    memory or the unit's port)."""
    if rep.verification == Verification.NOT_RULED_OUT:
        return f"NOT verified: {safe(rep.unverified)}"
    if rep.released is None:
        return f"GPU memory not verified: {safe(rep.unverified)}"
    return f"GPU memory on {gpus_phrase(rep.verified_gpus)} {'released' if rep.released else 'NOT released'}"


def print_down(result: DownResult) -> None:
    rep, t = result.report, result.timings
    procs = rep.results + rep.swept
    by = {s: sum(1 for r in procs if r.ended_by == s) for s in ("SIGTERM", "SIGKILL")}
    name, before = safe(result.name), result.previous_state.value
    if result.set_aside:
        _out(f"Unit {name}: corrupt record ({safe(result.corrupt)}) moved to {safe(result.set_aside)}")
    if result.cleared is not None:
        n = len(result.cleared.results)
        _out(f"Cleared {n} process{'es' if n != 1 else ''} the unit left on its GPUs")
    if not procs:
        _say(f"Unit {name} ({before}): no process left to stop; {memory_text(rep)}"
             + (f" ({t['verify_s']:.2f} s)" if rep.verification in (Verification.RELEASED,
                                                                    Verification.NOT_RELEASED) else ""))
        _warnings(result)
        return
    verdict = "stopped" if rep.verification != Verification.NOT_RULED_OUT else "NOT verified stopped"
    _say(f"Unit {name} {verdict} ({before} before): {len(procs)} process{'es' if len(procs) != 1 else ''} "
         f"(SIGTERM {by['SIGTERM']}, SIGKILL {by['SIGKILL']}) in {t['stop_s']:.2f} s; {memory_text(rep)}"
         + (f" after {t['verify_s']:.2f} s more" if rep.verification in (Verification.RELEASED,
                                                                        Verification.NOT_RELEASED) else ""))
    if rep.verification in (Verification.RELEASED, Verification.NOT_RELEASED) and rep.unverified:
        _out(f"  not verified: {safe(rep.unverified)}")
    _warnings(result)


def _warnings(result: DownResult) -> None:
    for w in result.warnings:
        _out(f"  warning: {safe(w)}")


def report_down_failure(result: DownResult) -> None:
    """Why the unit is not fully stopped, on stderr (nothing for one that is)."""
    if result.ok:
        return
    rep, err = result.report, sys.stderr
    leaks = [p for d in rep.diagnosis for p in d.problems if p.pid is None and p.used_memory]
    for d in rep.diagnosis:
        err.write(f"gpuslate: {safe(d.summary())}\n")
    for p in leaks:
        err.write(f"gpuslate: remedy: {safe(p.remedy)}\n")
    alive = [r.victim.ident.pid for r in rep.results + rep.swept if r.alive]
    strays = [s for s in result.strays if s.blocking]
    why = (f"processes still running: {alive}" if alive else
           "processes not found in it and not proven its own, which gpuslate therefore never signals, hold its "
           "GPU memory or port: " + "; ".join(f"pid {s.pid} ('{s.remedy()}' ends it)" for s in strays)
           if strays and result.cleared is None else
           f"its GPU memory could not be verified: {rep.unverified}" if rep.released is None
           else "memory on its GPUs is held by no process (a leak; see above)" if leaks
           else "its GPU memory was not released in time")
    err.write(f"gpuslate: error: unit {safe(result.name)} not fully stopped: {safe(why)}\n")


def show_down(result: DownResult) -> None:
    print_front(result.front)
    print_down(result)
    if not result.ok:
        report_down_failure(result)


# -- swap ----------------------------------------------------------------------------------------

def show_swap(result: SwapResult) -> None:
    print_swap(result)
    report_swap_failure(result)


def print_swap(result: SwapResult) -> None:
    """What was stopped and started (or parked and resumed), each phase timed, the prefetch and the downtime."""
    if result.parked is not None and (result.parked.ok or result.down is None):
        print_park(result.parked)
    if result.down is not None:
        print_down(result.down)
    if result.resumed is not None and result.resumed.ok:
        print_resume(result.resumed)
    if result.up is not None and result.up.ok:
        print_up(result.up)
    if result.fallback:
        sys.stderr.write(f"gpuslate: fell back to a cold switch: {safe(result.fallback)}\n")
    if result.rollback is not None and result.rollback.ok:
        _out(f"Rolled back: {safe(result.old)} is serving again.")
        print_up(result.rollback)
    old, new = safe(result.old), safe(result.new)
    for key, label in _PHASES:
        if key in result.phases:
            _out(f"  {label.format(old=old, new=new):<28} {result.phases[key]:8.3f} s")
    overhead = result.overhead_s
    _out(f"  {'total':<28} {result.total_s:8.3f} s")
    if overhead is not None:  # a line of its own: the phases' column fits a 60-column terminal
        _out(f"  {'of which gpuslate overhead':<28} {overhead:8.3f} s")
    _print_prefetch(result)
    _print_downtime(result)
    print_front(result.front)


def print_front(front: FrontReport | None) -> None:
    """What the clients of a front saw, and where the front was left (one or two lines)."""
    if front is None:
        return
    parts = []
    if front.hold is not None:
        h = front.hold
        parts.append(f"{h.held} request{'s' if h.held != 1 else ''} held (longest {h.longest_hold_s:.3f} s)")
        if h.failed:
            parts.append(f"{h.failed} failed by the front")
    if front.drain is not None:
        d = front.drain
        cut = f", {d.cut} CUT at the {d.timeout_s:g} s drain timeout" if d.cut else ""
        parts.append(f"{d.drained} drained{cut}")
    where = {FrontState.SERVING: f"serving {safe(front.unit or '?')}",
             FrontState.STOPPED: "stopped"}.get(front.state, f"{front.state.value.upper()}")
    if front.note and front.ok:  # left as it should be, and how it came to be so (started again, re-routed)
        where += f" ({safe(front.note)})"
    _out(f"Front {safe(front.address)}: " + "; ".join([*parts, where]))
    if front.note and not front.ok:
        sys.stderr.write(f"gpuslate: front {safe(front.address)}: {safe(front.note)}\n")


def report_swap_failure(result: SwapResult) -> None:
    """Which part failed, on stderr."""
    old, new = safe(result.old), safe(result.new)
    if result.status == SwapStatus.DOWN_FAILED:
        sys.stderr.write(f"gpuslate: error: could not stop {old} cleanly; {new} was not started\n")
    elif result.status == SwapStatus.PARK_FAILED and result.parked is not None:
        report_park_failure(result.parked)
        sys.stderr.write(f"gpuslate: error: {old} was not parked (--no-fallback); {new} was not started\n")
    elif result.status == SwapStatus.RESUME_FAILED and result.resumed is not None:
        report_resume_failure(result.resumed)
    elif result.up is not None and not result.up.ok:
        report_up_failure(result.up)
        if result.rollback is not None:
            if result.rollback.ok:
                sys.stderr.write(f"gpuslate: rolled back: {old} is ready again\n")
            else:
                report_up_failure(result.rollback)


def _print_prefetch(result: SwapResult) -> None:
    pf = result.prefetch
    if pf is None:
        return
    if pf.status in ("done", "partial"):
        n = len(pf.plan.files)
        took = f" in {pf.seconds:.3f} s, {format_size(int(pf.read_bytes / pf.seconds))}/s" if pf.seconds else ""
        _out(f"  prefetch: {pf.status.value}, {format_size(pf.read_bytes)} of {format_size(pf.plan.total)} in "
             f"{n} file{'s' if n != 1 else ''}{took}")
    else:
        why = pf.plan.warning or pf.error
        _out(f"  prefetch: {pf.status.value}" + (f" ({safe(why)})" if why else ""))


def _print_downtime(result: SwapResult) -> None:
    """Nothing served for downtime_s: its parts, one line each."""
    if result.downtime_s is None or not result.downtime:
        return
    _out(f"  {'downtime (nothing serves)':<28} {result.downtime_s:8.3f} s")
    parts = result.downtime
    old, new = safe(result.old), safe(result.new)
    for key, label in _DOWNTIME:
        if key in parts:
            _out(f"    {label.format(old=old, new=new):<26} {parts[key]:8.3f} s")
    if "start_to_port_open_s" not in parts and "start_to_ready_s" in parts:
        _out(f"    {'process start -> ready':<26} {parts['start_to_ready_s']:8.3f} s")


# -- park, resume ------------------------------------------------------------------------------

def print_park(result: ParkResult) -> None:
    """What was parked, how, what the proof shows, and where the memory went (stdout)."""
    name = safe(result.name)
    t = result.timings
    if result.status.value == "already_parked":
        _out(f"Unit {name} is already parked ({safe(result.method or '?')})")
        return
    if result.ok:
        held = f"; {format_size(result.host_bytes)} now in host memory" if result.host_bytes else ""
        kept = sum(g.kept for g in result.proof.gpus) if result.proof else 0
        gpus = [g.gpu for g in result.proof.gpus] if result.proof else []
        _out(f"Unit {name} parked by {safe(result.method or '?')} in {t.get('total_s', 0):.2f} s: GPU memory released "
             f"on {gpus_phrase(gpus)}, proven (residue {format_size(kept)}){held}")
        _out(f"  how: {safe(result.why)}")
        for key, label in (("drain_s", "drain"), ("park_s", "park calls"), ("prove_s", "proof (NVML)")):
            if key in t:
                _out(f"  {label:<28} {t[key]:8.3f} s")
    print_front(result.front)


def report_park_failure(result: ParkResult) -> None:
    """Why it was not parked, the figures that failed, and where the unit was left (stderr)."""
    if result.ok:
        return
    err = sys.stderr
    if result.proof is not None:
        for line in result.proof.problems:
            err.write(f"gpuslate: {safe(line)}\n")
    left = {True: "; it was undone: the unit serves again", False: "; it was NOT undone"}.get(result.undone, "") \
        if result.undone is not None else ""
    err.write(f"gpuslate: error: unit {safe(result.name)} not parked ({result.status.value}): "
              f"{safe(result.reason or result.why)}{left}\n")


def show_park(result: ParkResult) -> None:
    print_park(result)
    report_park_failure(result)


def print_resume(result: ResumeResult) -> None:
    name = safe(result.name)
    t = result.timings
    if result.status.value == "not_parked":
        _out(f"Unit {name} is not parked: it serves")
        return
    if result.ok:
        answer = result.answer or {}
        _out(f"Unit {name} resumed ({safe(result.method or '?')}) in {t.get('total_s', 0):.2f} s: memory back, "
             f"serving, {safe(str(answer.get('detail') or 'answer not compared'))}")
        for key, label in (("resume_s", "resume calls"), ("back_s", "memory back (NVML)"), ("ready_s", "ready"),
                           ("warmup_s", "warm-up completion"), ("reference_s", "reference answer")):
            if key in t:
                _out(f"  {label:<28} {t[key]:8.3f} s")
        if result.reason:
            _out(f"  note: {safe(result.reason)}")
    print_front(result.front)


def report_resume_failure(result: ResumeResult) -> None:
    if result.ok:
        return
    sys.stderr.write(f"gpuslate: error: unit {safe(result.name)} not resumed ({result.status.value}): "
                     f"{safe(result.reason or '')}\n")


def show_resume(result: ResumeResult) -> None:
    print_resume(result)
    report_resume_failure(result)


# -- ps ------------------------------------------------------------------------------------------

def show_ps(result: PsResult) -> None:
    out = sys.stdout
    if not result.units and not result.hidden:
        _out("No units. Start one with: gpuslate up NAME --gpus LIST --port PORT -- COMMAND ...")
    elif not result.units:
        _out("No units running or stopped within the last hour.")
    else:
        rows = []
        for u in result.units:
            r = u.record
            ttr = r.time_to_ready_s if r is not None else None
            port = r.port if r is not None else None
            rows.append([Cell(safe(u.unit.name)), Cell(u.state.value), Cell(str(u.pid or "-")),
                         Cell(format_duration(u.uptime_s)), Cell(str(port or "-")), Cell(gpu_text(u.unit.gpus)),
                         Cell(format_size(u.gpu_memory) if u.gpu_memory is not None else "-"),
                         Cell(f"{ttr:.2f}s" if ttr is not None else "-")])
        width, color = width_of(out), use_color(out)
        # two spaces between columns where they fit, one where not; narrower still, the columns
        # after the name go on under it (a table again, each row named): nothing is ever cut
        gap = 2 if width is None or len(table(_PS_COLUMNS, rows, color=False, width=None, gap=2)[0]) <= width else 1
        for line in tables(_PS_COLUMNS, rows, color=color, width=width, gap=gap):
            _out(line)
    if result.hidden:
        n = result.hidden
        _out(f"({n} unit{'s' if n != 1 else ''} stopped more than an hour ago not shown: gpuslate ps -a)")
    for u in result.units:
        if u.park is not None:
            _out(safe(str(u.park.get("line") or u.park.get("phase"))))
    for f in result.fronts:
        _out(safe(str(f.get("line") or f.get("address"))))
    for w in result.warnings:
        _out(f"warning: {safe(w)}")


# -- restart, rm, several units ------------------------------------------------------------------

def show_restart(result: RestartResult) -> None:
    """What was stopped, what is serving again and the downtime; a failure's story on stderr."""
    if result.down is not None:
        print_down(result.down)
    if result.up is not None and result.up.ok:
        print_up(result.up)
    if result.ok:
        _out(f"Unit {safe(result.name)} restarted ({result.previous_state.value} before) in {result.total_s:.2f} s"
             + (f"; downtime {result.downtime_s:.3f} s" if result.downtime_s is not None else ""))
    print_front(result.front)
    report_restart_failure(result)


def report_restart_failure(result: RestartResult) -> None:
    name = safe(result.name)
    if result.down is not None and not result.down.ok:
        report_down_failure(result.down)
        sys.stderr.write(f"gpuslate: error: could not stop {name} cleanly; it was not started again\n")
    elif result.up is not None and not result.up.ok:
        report_up_failure(result.up)


def show_rm(result: RmResult) -> None:
    for u in result.units:
        n = len(u.files)
        _out(f"Removed unit {safe(u.name)} ({u.state.value}): {n} file{'s' if n != 1 else ''} (its record and logs)")


def show_batch(result: BatchResult) -> None:
    """Each unit as its own command shows it, in the order they ran, then what was left as it was
    and what was not reached."""
    show = {"up": show_up, "down": show_down, "restart": show_restart}[result.verb.value]
    for r in result.results:
        show(r)  # type: ignore[operator]
    report_batch(result, sys.stdout)


def report_batch_failures(result: BatchResult) -> None:
    """With ``--json``: each failed unit's story, then the batch's own lines, on stderr."""
    story = {"up": report_up_failure, "down": report_down_failure, "restart": report_restart_failure}
    for one in result.results:
        if not one.ok:
            story[result.verb.value](one)  # type: ignore[operator]
    report_batch(result, sys.stderr)


def report_batch(result: BatchResult, file: IO[str]) -> None:
    """The batch's own lines (skipped, not reached, the count), after the units' (``--json``: on stderr)."""
    for s in result.skipped:
        _out(f"Unit {safe(s.name)}: {safe(s.reason)}, left as it is", file)
    if result.not_run:
        names = ", ".join(safe(n) for n in result.not_run)
        _out(f"Not {'started' if result.verb.value == 'up' else 'restarted'} (unit "
             f"{safe(result.failed_name or '?')} failed first): {names}", file)
    done = sum(1 for r in result.results if r.ok)
    _out(f"{result.verb.value}: {done} of {len(result.results) + len(result.not_run)} unit"
         f"{'s' if len(result.results) + len(result.not_run) != 1 else ''} done"
         + (f", {len(result.skipped)} left as they were" if result.skipped else "")
         + f" in {result.total_s:.2f} s", file)


def show_config(result: ConfigResult) -> None:
    """``gpuslate config``: the unit file resolved, as TOML that reads back as the same units."""
    sys.stdout.write(toml_text(result))
    sys.stdout.flush()
