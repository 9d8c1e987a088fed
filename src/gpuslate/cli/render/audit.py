"""The audit log as a table: who sent which signal to which process, and what became of it."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..._parse import format_gpu_list

if TYPE_CHECKING:
    from ...host.auditlist import AuditListing

_OUTCOME_STYLE = {
    "delivered": "green", "not_running": "dim", "pid_reused": "yellow", "refused": "yellow",
    "permission_denied": "red", "error": "red",
}


def print_log(listing: AuditListing) -> None:
    from rich.table import Table  # lazy: startup

    from .styled import CommandCell, cell, emit  # lazy: startup

    entries, path = listing.entries, listing.path
    if not entries:
        emit(f"no signals recorded in {cell(path)}" + (" for this host (the NVIDIA driver)" if listing.other_sims
                                                       else ""))
        for sim in listing.other_sims:
            emit(f"  it holds entries of the simulated host {cell(sim)}: gpuslate audit --sim {cell(sim)}")
        return
    table = Table(box=None, pad_edge=False, collapse_padding=True, header_style="bold")
    for col, just in (("Time", "left"), ("By", "left"), ("Action", "left"), ("Signal", "left"),
                      ("PID", "right"), ("User", "left"), ("Command", "left"), ("GPUs", "left"),
                      ("Outcome", "left")):
        # on a narrow terminal the command is cut first and the outcome wraps at spaces;
        # piped, nothing is cut or wrapped
        table.add_column(col, justify=just,  # type: ignore[arg-type]
                         no_wrap=col not in ("Command", "Outcome"),
                         min_width=len("delivered") if col == "Outcome" else 8 if col == "Command" else None)
    for e in entries:
        target: dict[str, Any] = e["target"] if isinstance(e.get("target"), dict) else {}
        actor: dict[str, Any] = e["actor"] if isinstance(e.get("actor"), dict) else {}
        gpus = target.get("gpus")
        try:
            gpu_text = format_gpu_list(gpus) if gpus else "-"
        except (TypeError, ValueError):
            gpu_text = str(gpus)
        table.add_row(
            cell(_local_time(e.get("time"))), cell(_by(actor)), cell(e.get("action") or "-"),
            cell(e.get("signal") or "-"), cell(target.get("pid", "-")),
            cell(target.get("user") or "-"), CommandCell(str(target.get("command") or "-")),
            cell(gpu_text), _outcome_cell(e),
        )
    emit(table, f"[dim]{len(entries)} entries from {cell(path)}[/]")


def _by(actor: dict[str, Any]) -> str:
    user = str(actor.get("user") or "?")
    sudo = actor.get("sudo_user")
    return f"{user} (sudo {sudo})" if sudo else user


def _outcome_cell(e: dict[str, Any]) -> str:
    from .styled import cell  # lazy: startup

    outcome = e.get("outcome")
    if outcome is None:
        return "[yellow]unknown (run interrupted)[/]"
    text = cell(outcome)
    if e.get("outcome_detail"):
        text += f" [dim]{cell(e['outcome_detail'])}[/]"
    style = _OUTCOME_STYLE.get(str(outcome))
    return f"[{style}]{text}[/]" if style else text


def _local_time(iso: object) -> str:
    """The stored UTC time as local time, like ``status`` shows times."""
    import calendar  # lazy: startup

    if not isinstance(iso, str):
        return "-"
    try:
        epoch = calendar.timegm(time.strptime(iso[:19], "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return iso
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))
