"""Readable reports for ``clear`` and ``wait`` (rich), for a local run and a remote document alike
(see :mod:`.results`)."""

from __future__ import annotations

import sys
from typing import IO, Any

from ..._parse import format_gpu_list, format_size, gpus_phrase
from ...clearing.clear import ClearResult, ClearStatus
from ...clearing.plan import Plan, Role, Target, not_chosen
from ...clearing.wait import GpuDiagnosis, WaitResult
from ...host.daemons import DaemonHold
from ...proc.terminate import VictimResult
from .plain import Cell, Column, clean, table, use_color, width_of
from .styled import cell, command_limit, emit, one_line

#: the plan's columns, and the result's (after the act): only the command is ever cut (PIDs, users
#: and GPUs stay whole at any width); the signals are condensed (``TERM KILL``: when each was sent is
#: in the JSON and the audit log), and when each process ended is said in seconds after the first
_PLAN_COLUMNS = (Column("PID", "right"), Column("Role"), Column("User"), Column("GPUs"),
                 Column("GPU memory", "right"), Column("Command", command=True))
_RESULT_COLUMNS = (*_PLAN_COLUMNS[:5], Column("Signals"), Column("Ended", "right"), _PLAN_COLUMNS[5])
#: short names in the table (the JSON and the reasons say them whole)
_ROLE_WORD = {Role.FORKED: "forked"}


def _signal_word(name: str) -> str:
    return name.removeprefix("SIG")


def _ended_cell(r: VictimResult | None) -> Cell:
    """When the process ended (seconds after the first signal), and how where the last signal
    sent does not say it (``gone`` before any signal, a reused pid)."""
    if r is not None and r.permission_denied:
        return Cell("permission denied", ("red",))
    if r is not None and r.refused is not None:
        return Cell("refused at act time", ("yellow",))
    if r is None or r.exited_at is None:
        return Cell("still running", ("red",))
    last = next((s.signal for s in reversed(r.signals) if s.outcome == "delivered"), None)
    how = "" if r.ended_by == last or r.ended_by is None else f"{_signal_word(r.ended_by)} "
    return Cell(f"{how}{r.exited_at:.2f}s")


def ordered(targets: list[Target]) -> list[Target]:
    """Targets as a person reads them: job by job (the job of the lowest GPU first), each job's
    launcher first, then its processes by GPU."""
    first_gpu: dict[int, int] = {}
    for tg in targets:
        if tg.gpus:
            first_gpu[tg.job] = min(first_gpu.get(tg.job, tg.gpus[0]), min(tg.gpus))
    never = 1 << 30

    def key(tg: Target) -> tuple[int, int, bool, int, int]:
        return (first_gpu.get(tg.job, never), tg.job, tg.role != Role.LAUNCHER, min(tg.gpus, default=never),
                tg.ident.pid)

    return sorted(targets, key=key)


def plan_lines(plan: Plan, result: ClearResult | None = None, *, out: IO[str] | None = None) -> list[str]:
    """The plan's table (with ``result``: what the act did to each target), fitting ``out``'s
    terminal: only the command is cut, from the middle; piped, nothing is."""
    stream = out or sys.stdout
    by_pid = {r.victim.ident.pid: r for r in result.results} if result else {}
    targets = list(plan.targets)
    if result is not None:  # what the jobs forked while they were stopped comes after the plan
        planned = {tg.ident.pid for tg in targets}
        targets += [_forked_target(r) for r in result.results if r.victim.ident.pid not in planned]
    rows: list[list[Cell]] = []
    for tg in ordered(targets):
        row = [Cell(str(tg.ident.pid)), Cell(_ROLE_WORD.get(tg.role, tg.role.value)), Cell(clean(tg.user or "-")),
               Cell(format_gpu_list(tg.gpus) or "-"),
               Cell(format_size(tg.used_memory) if tg.used_memory is not None else "-")]
        if result is not None:
            r = by_pid.get(tg.ident.pid)
            sigs = " ".join(_signal_word(s.signal) + ("" if s.outcome == "delivered" else f" ({s.outcome})")
                            for s in (r.signals if r else []))
            row += [Cell(sigs or "-"), _ended_cell(r)]
        container = f"container {clean(tg.container)} " if tg.container else ""
        row.append(Cell(container + clean(tg.command)))
        rows.append(row)
    columns = _RESULT_COLUMNS if result is not None else _PLAN_COLUMNS
    return table(columns, rows, color=use_color(stream), width=width_of(stream), shrink=len(columns) - 1)


def _lines(lines: list[str]) -> list[Any]:
    """Lines laid out here (ANSI colours included), for :func:`~.styled.emit` beside rich markup."""
    from rich.text import Text  # lazy: startup

    return [Text.from_ansi(line, no_wrap=True, overflow="ignore") for line in lines]


def _forked_target(r: VictimResult) -> Target:
    i = r.victim.info
    return Target(r.victim.ident, i.get("user"), i.get("uid"), i.get("command") or "", i.get("name") or "", [],
                  None, Role.FORKED, i.get("reason") or "", i.get("job") or 0, None, (), None, None)


def print_plan(plan: Plan, file: IO[str] | None = None) -> None:
    n = len(plan.targets)
    out: list[Any] = [f"[bold]Plan[/]: {n} target{'s' if n != 1 else ''}; verifies {gpus_phrase(plan.gpus)}"]
    if plan.targets:
        out += _lines(plan_lines(plan, out=file))
    emit(*out, *_reasons(plan), *_spared(plan), file=file)


def _reasons(plan: Plan) -> list[str]:
    """Why each target is one, and which will be SIGKILLed early because SIGTERM cannot work."""
    out = []
    for tg in ordered(list(plan.targets)):
        line = f"  {tg.ident.pid}: {cell(tg.reason)}"
        if tg.ignores_sigterm:
            line += f" [yellow]({cell(tg.ignores_sigterm)}: SIGKILL once the rest of its job has exited)[/]"
        out.append(line)
    return out


def _spared(plan: Plan) -> list[str]:
    if not plan.spared:
        return []
    limit = command_limit()
    return ["[bold]Spared[/] (never signaled)"] + [
        f"  {s.pid} {cell(s.user or '-')} [dim]{one_line(s.command, limit)}[/]: {cell(s.reason)}" for s in plan.spared]


def _diagnosis(diag: list[GpuDiagnosis]) -> list[str]:
    out: list[str] = []
    limit = command_limit()
    for d in diag:
        used = format_size(d.used) if d.used is not None else "unknown"
        out.append(f"[red]GPU {d.gpu} not free[/]: {used} used (free means at most {format_size(d.max_used)})")
        for p in d.problems:
            who = "" if p.pid is None else f"PID {p.pid}: " if p.user is None and p.command is None else \
                f"PID {p.pid} ({holder_text(p.user, p.command, limit)}): "  # else the reason says it exited
            out.append(f"  - {who}{cell(p.reason)}")
            if p.remedy:
                out.append(f"    [dim]remedy: {cell(p.remedy)}[/]")
    return out


def holder_text(user: str | None, command: str | None, limit: int | None) -> str:
    """Who a holder is, as markup: ``user, command`` (the command cut to ``limit``, from the middle);
    what is not known is said, never a bare ``?``."""
    return f"{cell(user or 'user unknown')}, {one_line(command, limit) if command else 'command unknown'}"


def print_diagnosis(diag: list[GpuDiagnosis], file: IO[str] | None = None) -> None:
    emit(*_diagnosis(diag), file=file)


def _baseline(holds: tuple[DaemonHold, ...]) -> list[str]:
    """What spared GPU daemons hold, apart: the host's baseline, not counted as used."""
    return [f"  [dim]GPU {h.gpu}: {format_size(h.bytes)} held by {cell(h.program)} (PID {h.pid}), spared: "
            "a GPU daemon's baseline, not counted as used[/]" for h in holds]


def print_wait(result: WaitResult) -> None:
    gpus = gpus_phrase(result.gpus)
    if result.ok:
        emit(f"{gpus} free after {result.elapsed_s:.3f} s", *_baseline(result.baseline))
        return
    why = " (memory held by no process, which waiting does not free)" if result.leaked else ""
    emit(f"{gpus} not free after {result.elapsed_s:.1f} s{why}:", *_diagnosis(result.diagnosis))


def print_clear(result: ClearResult) -> None:
    plan = result.plan
    if result.status == ClearStatus.DRY_RUN:
        emit("[yellow]Dry run: nothing was signaled.[/]")
        print_plan(plan)
        if result.baseline:
            emit("[bold]Spared GPU daemons' memory[/] (not counted as used)", *_baseline(result.baseline))
        return
    out: list[Any] = _lines(plan_lines(plan, result)) if plan.targets else ["No targets."]
    out += _spared(plan)
    before = {r.index: r for r in result.before}
    if result.after:
        out.append("[bold]GPU memory[/] before → after")
    for r in result.after:
        b = before.get(r.index)
        bu = format_size(b.memory.used) if b is not None and b.memory else "?"
        au = format_size(r.memory.used) if r.memory else "?"
        base = [h for h in result.baseline if h.gpu == r.index]
        note = "; ".join(f"{format_size(h.bytes)} held by {cell(h.program)} (PID {h.pid}), spared" for h in base)
        out.append(f"  GPU {r.index}: {bu} → {au}" + (f" [dim]({note})[/]" if note else "")
                   + (f" [red]{cell(r.error)}[/]" if r.error else ""))
    t = result.timings
    parts = [f"{k.removesuffix('_s')} {v:.3f} s" for k, v in t.items()]
    out.append("[bold]Timings[/]: " + ", ".join(parts))
    for rs in result.respawned:
        out.append(f"[red]Restarted[/]: PID {rs.pid} ({one_line(rs.command, command_limit())}) replaced {rs.replaces}; "
                   f"supervisor {cell(rs.supervisor or 'unknown')}. {cell(rs.remedy)}")
    refused = [r for r in result.results if r.refused is not None]
    if refused:
        out.append("[bold]Refused at act time[/] (not signaled; what they started was):")
        out += [f"  {r.victim.ident.pid}: {cell(r.refused or '')}" for r in refused]
    out += _diagnosis(result.diagnosis)
    if result.status == ClearStatus.NOTHING_SELECTED and not all(not_chosen(s.reason) for s in plan.spared):
        out.append("[red]Nothing you may signal was selected[/]: every process the selector chose is spared "
                   "(see above); nothing was signaled and nothing was verified.")
    elif result.status == ClearStatus.NOTHING_SELECTED:
        others = " (those above are not selected)" if plan.spared else ""
        out.append("[red]Nothing was selected[/]: no process holding a GPU matches the selection (--pid, --user, "
                   f"--match){others}; nothing was signaled and nothing was verified.")
    elif result.status == ClearStatus.REFUSED:
        out.append("[red]Not free: a target refused at act time still holds GPU memory (see above); "
                   "signalling it would have ended processes that are not targets.[/]")
    elif result.status == ClearStatus.CLEAN:
        out.append(f"[green]Clean[/]: {gpus_phrase(plan.gpus)} free (at most "
                   f"{format_size(result.max_used)} used each), verified.")
    elif result.status == ClearStatus.PERMISSION_DENIED:
        out.append("[red]Some targets could not be signaled (permission denied).[/]")
    elif result.status == ClearStatus.HELD_BY_OTHERS:
        out.append("[red]Not free: every target is gone, and what still holds the GPUs is not a target "
                   "(see above; --all-users, --include-handles or other --gpus may be what you meant).[/]")
    elif result.status == ClearStatus.LEAKED:
        out.append("[red]Not free: every target is gone, and memory held by no process stays (a leaked or "
                   "driver-held context, see above): nothing gpuslate may signal holds it.[/]")
    else:
        out.append("[red]Not free within the timeout.[/]")
    emit(*out)
