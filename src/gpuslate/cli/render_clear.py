"""Readable reports for ``clear`` and ``wait`` (rich)."""

from __future__ import annotations

from typing import IO, Any

from .._parse import format_gpu_list, format_size
from ..slate.clear import ClearResult, ClearStatus
from ..slate.plan import Plan, Role, Target
from ..slate.wait import GpuDiagnosis
from .render import console, one_line


def plan_table(plan: Plan, result: ClearResult | None = None) -> Any:
    from rich.table import Table

    t = Table(box=None, pad_edge=False, header_style="bold")
    cols = ["PID", "Role", "User", "GPUs", "GPU memory", "Command"]
    if result is not None:
        cols[5:5] = ["Signals", "Ended"]
    for c in cols:
        t.add_column(c, no_wrap=True, justify="right" if c in ("PID", "GPU memory") else "left")
    by_pid = {r.victim.ident.pid: r for r in result.results} if result else {}
    targets = list(plan.targets)
    if result is not None:  # what the jobs forked while they were stopped comes after the plan
        planned = {tg.ident.pid for tg in targets}
        targets += [_forked_target(r) for r in result.results if r.victim.ident.pid not in planned]
    for tg in targets:
        row = [str(tg.ident.pid), tg.role.value, tg.user or "-", format_gpu_list(tg.gpus) or "-",
               format_size(tg.used_memory) if tg.used_memory is not None else "-"]
        if result is not None:
            r = by_pid.get(tg.ident.pid)
            sigs = ", ".join(f"{s.signal}@{s.at:.3f}s" + ("" if s.outcome == "delivered" else f" ({s.outcome})")
                             for s in (r.signals if r else []))
            ended = "[red]still running[/]" if r is None or r.exited_at is None else \
                f"{r.ended_by} @{r.exited_at:.3f}s"
            if r is not None and r.permission_denied:
                ended = "[red]permission denied[/]"
            row += [sigs or "-", ended]
        container = f"[magenta]container {tg.container}[/] " if tg.container else ""
        row.append(container + one_line(tg.command))
        t.add_row(*row)
    return t


def _forked_target(r: Any) -> Target:
    i = r.victim.info
    return Target(r.victim.ident, i.get("user"), i.get("uid"), i.get("command") or "", i.get("name") or "", [],
                  None, Role.FORKED, i.get("reason") or "", i.get("job") or 0, None, None, None)


def print_plan(plan: Plan, file: IO[str] | None = None) -> None:
    c = console(file)
    verified = format_gpu_list(plan.gpus) if plan.gpus else "none"
    n = len(plan.targets)
    c.print(f"[bold]Plan[/]: {n} target{'s' if n != 1 else ''}; verifies GPUs {verified}")
    if plan.targets:
        c.print(plan_table(plan))
    _print_reasons(c, plan)
    _print_spared(c, plan)


def _print_reasons(c: Any, plan: Plan) -> None:
    """Why each target is one, and which will be SIGKILLed early because SIGTERM cannot work."""
    for tg in plan.targets:
        line = f"  {tg.ident.pid}: {tg.reason}"
        if tg.ignores_sigterm:
            line += f" [yellow]({tg.ignores_sigterm}: SIGKILL once the rest of its job has exited)[/]"
        c.print(line, highlight=False)


def _print_spared(c: Any, plan: Plan) -> None:
    if plan.spared:
        c.print("[bold]Spared[/] (never signaled)")
        for s in plan.spared:
            c.print(f"  {s.pid} {s.user or '-'} [dim]{one_line(s.command, 60)}[/]: {s.reason}", highlight=False)


def print_diagnosis(diag: list[GpuDiagnosis], file: IO[str] | None = None) -> None:
    c = console(file)
    for d in diag:
        used = format_size(d.used) if d.used is not None else "unknown"
        c.print(f"[red]GPU {d.gpu} not free[/]: {used} used (free means at most {format_size(d.max_used)})")
        for p in d.problems:
            who = f"PID {p.pid} ({p.user}, {one_line(p.command, 50)})" if p.pid is not None else "no process"
            c.print(f"  - {who}: {p.reason}")
            if p.remedy:
                c.print(f"    [dim]remedy: {p.remedy}[/]")


def print_clear(result: ClearResult) -> None:
    c = console()
    plan = result.plan
    if result.status == ClearStatus.DRY_RUN:
        c.print("[yellow]Dry run: nothing was signaled.[/]")
        print_plan(plan)
        return
    if plan.targets:
        c.print(plan_table(plan, result))
    else:
        c.print("No targets.")
    _print_spared(c, plan)
    before = {r.index: r for r in result.before}
    c.print("[bold]GPU memory[/] before → after")
    for r in result.after:
        b = before.get(r.index)
        bu = format_size(b.memory.used) if b is not None and b.memory else "?"
        au = format_size(r.memory.used) if r.memory else "?"
        c.print(f"  GPU {r.index}: {bu} → {au}" + (f" [red]{r.error}[/]" if r.error else ""))
    t = result.timings
    parts = [f"{k.removesuffix('_s')} {v:.3f} s" for k, v in t.items()]
    c.print("[bold]Timings[/]: " + ", ".join(parts))
    for rs in result.respawned:
        c.print(f"[red]Restarted[/]: PID {rs.pid} ({one_line(rs.command, 60)}) replaced {rs.replaces}; "
                f"supervisor {rs.supervisor or 'unknown'}. {rs.remedy}")
    if result.diagnosis:
        print_diagnosis(result.diagnosis)
    if result.status == ClearStatus.CLEAN:
        c.print(f"[green]Clean[/]: GPUs {format_gpu_list(plan.gpus)} free (at most "
                f"{format_size(result.max_used)} used each), verified.")
    elif result.status == ClearStatus.PERMISSION_DENIED:
        c.print("[red]Some targets could not be signaled (permission denied).[/]")
    elif result.status == ClearStatus.HELD_BY_OTHERS:
        c.print("[red]Not free: every target is gone, and what still holds the GPUs is not a target "
                "(see above; --all-users, --include-handles or other --gpus may be what you meant).[/]")
    else:
        c.print("[red]Not free within the timeout.[/]")
