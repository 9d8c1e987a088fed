"""Output of a run on several hosts: each host's document under
a heading (rendered by the same renderers as a local run where the command has
them), and a summary table. Every string from a host is escaped."""

from __future__ import annotations

import sys
from typing import Any, Callable


from .._parse import format_size
from .._time import format_duration
from ..remote.fleet import FleetResult, HostOutcome
from .exits import exit_code_of
from .render import console, one_line


def _t(value: object) -> str:
    """A string from another host, for a rich line: one line, markup-escaped, and (with
    one_line) control characters shown as escapes, never sent to the terminal."""
    return one_line(str(value), 400)


def _schema_name(doc: dict[str, Any]) -> str:
    s = doc.get("schema")
    return s.removeprefix("gpuslate.").rsplit(".v", 1)[0] if isinstance(s, str) else ""


def render_document(doc: dict[str, Any], label: str) -> None:
    """One host's document, as the local command would print it."""
    render = _RENDERERS.get(_schema_name(doc), _render_generic)
    render(doc, label)


def _status(doc: dict[str, Any], label: str) -> None:
    from ..remote.documents import snapshot  # lazy: startup
    from .render_status import print_status  # lazy: startup

    snap = snapshot(doc)
    # the heading names the host as it was asked for; nvidia-smi documents say so
    host = label if snap.host in (label, "?") else f"{label} ({snap.host})"
    if doc.get("source") == "nvidia-smi":
        host += " (from nvidia-smi: gpuslate is not installed there)"
    print_status(snap._replace(host=host), local=False)


def _clear(doc: dict[str, Any], label: str) -> None:
    from ..remote.documents import clear_result  # lazy: startup
    from .render_clear import print_clear  # lazy: startup

    print_clear(clear_result(doc))


def _wait(doc: dict[str, Any], label: str) -> None:
    from ..remote.documents import diagnosis  # lazy: startup
    from .clear import print_wait  # lazy: startup

    print_wait(bool(doc.get("ok")), doc.get("gpus") or [], float(doc.get("elapsed_s") or 0),
               [diagnosis(d) for d in doc.get("diagnosis") or []])


def _log(doc: dict[str, Any], label: str) -> None:
    from .audit import print_log  # lazy: startup

    print_log(list(doc.get("entries") or []), str(doc.get("path") or "?"))


def _ps(doc: dict[str, Any], label: str) -> None:
    from .up import gpu_text  # lazy: startup

    units = doc.get("units") or []
    if not units:
        console().print("No units.")
        return
    from rich.table import Table  # lazy: startup

    t = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("NAME", "STATE", "PID", "UPTIME", "PORT", "GPUS", "GPU MEMORY", "READY IN"):
        t.add_column(col, no_wrap=True)
    for u in units:
        ttr = u.get("time_to_ready_s")
        t.add_row(_t(u.get("name")), _t(u.get("state")), str(u.get("pid")),
                  format_duration(u.get("uptime_s")), str(u.get("port") or "-"), gpu_text(u.get("gpus") or []),
                  format_size(u["gpu_memory"]) if u.get("gpu_memory") is not None else "-",
                  f"{ttr:.2f}s" if isinstance(ttr, (int, float)) else "-")
    console().print(t)


def _up(doc: dict[str, Any], label: str) -> None:
    """The lines of a local ``up`` (cli/up.py print_up / report_failure), from the document."""
    from .up import gpu_text  # lazy: startup

    c = console()
    name = _t(doc.get("name"))
    if doc.get("ok"):
        port = doc.get("port")
        line = (f"Unit {name} ready in {doc.get('time_to_ready_s') or 0:.2f} s: pid {doc.get('pid')}, "
                f"GPUs {gpu_text(doc.get('gpus') or [])}, port {port if port is not None else '-'}, "
                f"{_t(doc.get('containment'))}")
        smoke = doc.get("smoke")
        if isinstance(smoke, dict) and isinstance(smoke.get("latency_s"), (int, float)):
            line += f", smoke completion {smoke['latency_s']:.3f} s"
        c.print(line)
        ready = doc.get("readiness") if isinstance(doc.get("readiness"), dict) else {}
        c.print(f"  readiness: {_t(ready.get('kind'))} ({one_line(str(ready.get('detail')), 160)})")
        c.print(f"  log: {_t(doc.get('log'))}")
        return
    tail = doc.get("log_tail") or []
    if tail:
        c.print(f"--- last {len(tail)} lines of {_t(doc.get('log'))} ---")
        for line in tail:
            c.print(one_line(str(line), 200))
        c.print("---")
    c.print(f"[red]unit {name} failed[/]: {_t(doc.get('failure'))}")
    teardown = doc.get("teardown")
    if isinstance(teardown, dict):
        c.print("stopped what it left running; " +
                ("GPUs verified clean" if teardown.get("memory_released") else "[red]NOT clean[/]"))


def _down(doc: dict[str, Any], label: str) -> None:
    """The line of a local ``down`` (cli/down.py print_down), from the document."""
    procs = (doc.get("processes") or []) + (doc.get("swept") or [])
    t = doc.get("timings") or {}
    name, before = _t(doc.get("name")), _t(doc.get("previous_state"))
    released = ("released" if doc.get("memory_released") else "[red]NOT released[/]"
                if doc.get("memory_released") is not None else f"not verified: {_t(doc.get('unverified'))}")
    if not procs:
        console().print(f"Unit {name} ({before}): no process left to stop; GPU memory {released} "
                        f"({t.get('verify_s', 0):.2f} s)")
        return
    by = {s: sum(1 for p in procs if p.get("ended_by") == s) for s in ("SIGTERM", "SIGKILL")}
    console().print(f"Unit {name} stopped ({before} before): {len(procs)} processes (SIGTERM {by['SIGTERM']}, "
                    f"SIGKILL {by['SIGKILL']}) in {t.get('stop_s', 0):.2f} s; GPU memory {released} after "
                    f"{t.get('verify_s', 0):.2f} s more")


def _swap(doc: dict[str, Any], label: str) -> None:
    """The lines of a local ``swap`` (cli/swap.py), from the document."""
    from .swap import PHASE_LABELS  # lazy: startup

    if isinstance(doc.get("down"), dict):
        _down(doc["down"], label)
    for key in ("up", "rollback"):
        if isinstance(doc.get(key), dict) and doc[key].get("ok"):
            if key == "rollback":
                console().print(f"Rolled back: {_t(doc.get('old'))} is serving again.")
            _up(doc[key], label)
    c = console()
    phases = doc.get("phases") or {}
    old, new = _t(doc.get("old")), _t(doc.get("new"))
    for key, text in PHASE_LABELS:
        if isinstance(phases.get(key), (int, float)):
            c.print(f"  {text.format(old=old, new=new):<28} {phases[key]:8.3f} s")
    overhead = doc.get("overhead_s")
    c.print(f"  {'total':<28} {doc.get('total_s') or 0:8.3f} s"
            + (f"  (gpuslate overhead {overhead:.3f} s)" if isinstance(overhead, (int, float)) else ""))


def _install(doc: dict[str, Any], label: str) -> None:
    """``install``: where it went, which Python runs it, and what to set when the fleet will not find it."""
    c = console()
    c.print(f"  installed gpuslate {_t(doc.get('version'))} at {_t(doc.get('launcher'))} "
            f"(Python {_t(doc.get('python_version'))}: {_t(doc.get('python'))}; status: {_t(doc.get('status_check'))})")
    for w in doc.get("warnings") or []:
        c.print(f"  [yellow]warning:[/] {_t(w)}")
    if doc.get("remote_command"):
        c.print(f"  [yellow]not where --host looks:[/] set GPUSLATE_REMOTE_COMMAND={_t(doc['remote_command'])} here")


def _text(doc: dict[str, Any], label: str) -> None:
    sys.stdout.write(str(doc.get("text") or ""))  # logs: printed as a local 'gpuslate logs' prints them
    sys.stdout.flush()


def _render_generic(doc: dict[str, Any], label: str) -> None:
    """A command without a fleet renderer: its scalar fields, one a line (--json has everything)."""
    c = console()
    for k, v in doc.items():
        if isinstance(v, (str, int, float, bool)) or v is None:
            c.print(f"  {_t(k)}: {one_line(str(v))}")
        elif isinstance(v, (list, dict)):
            c.print(f"  {_t(k)}: [dim]{len(v)} {'items' if isinstance(v, list) else 'fields'}[/]")


_RENDERERS: dict[str, Callable[[dict[str, Any], str], None]] = {
    "status": _status, "clear": _clear, "wait": _wait, "log": _log, "audit": _log, "ps": _ps, "up": _up, "down": _down,
    "swap": _swap, "install": _install, "": _text,
}


def print_plans(plans: FleetResult) -> int:
    """Every host's clear plan (the dry runs), on stderr before the one question; the number of targets."""
    from ..remote.documents import clear_result  # lazy: startup
    from .render_clear import print_plan  # lazy: startup

    c = console(sys.stderr)
    n = 0
    for o in plans.hosts:
        _heading(c, o)
        if o.result is not None and o.ok:
            plan = clear_result(o.result).plan
            n += len(plan.targets)
            print_plan(plan, file=sys.stderr)
        else:
            _error(c, o)
    return n


def _heading(c: Any, o: HostOutcome) -> None:
    c.print(f"[bold]── {_t(o.host.label)} ──[/]")


def _error(c: Any, o: HostOutcome) -> None:
    if o.error is None:
        return
    c.print(f"[red]error ({_t(o.error.code)}):[/] {_t(o.error.message)}")
    if o.error.hint:
        c.print(f"[dim]hint: {_t(o.error.hint)}[/]")


def print_fleet(result: FleetResult, command: str) -> None:
    c = console()
    for o in result.hosts:
        _heading(c, o)
        if o.result is not None:
            render_document(o.result, o.host.label)
        _error(c, o)
    if len(result.hosts) > 1 or any(not o.ok for o in result.hosts):
        from rich.table import Table  # lazy: startup

        t = Table(box=None, pad_edge=False, header_style="bold", title_justify="left")
        for col in ("HOST", "RESULT", "EXIT", "TIME", "DETAIL"):
            t.add_column(col, no_wrap=col != "DETAIL", justify="right" if col in ("EXIT", "TIME") else "left")
        for o in result.hosts:
            res = "[green]ok[/]" if o.ok else f"[red]{_t(o.error.code if o.error else 'failed')}[/]"
            detail = "" if o.error is None else one_line(o.error.message.removeprefix(f"{o.host.label}: "), 80)
            if o.ok and o.result is not None and o.result.get("source") == "nvidia-smi":
                detail = "gpuslate missing: read-only view from nvidia-smi"
            t.add_row(_t(o.host.label), res, str(exit_code_of(o)), f"{o.elapsed_s:.2f}s", detail)
        ok = sum(o.ok for o in result.hosts)
        c.print()
        n = len(result.hosts)
        c.print(f"[bold]{_t(command)}[/] on {n} host{'s' if n != 1 else ''}: {ok} ok, {n - ok} failed")
        c.print(t)
