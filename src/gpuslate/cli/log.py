"""``gpuslate log``: every signal gpuslate sent, and what became of it."""

from __future__ import annotations

import argparse
from typing import Any

from .common import add_common, print_json

SCHEMA = "gpuslate.log.v1"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("log", help="show the audit log of every signal gpuslate sent",
                       description="Show the audit log (newest last): who sent which signal to which "
                       "process on which GPUs, and the outcome. An entry without an outcome belongs "
                       "to a run that was interrupted after recording it.")
    add_common(p)
    p.add_argument("--limit", type=_limit, default=50, metavar="N",
                   help="show the newest N entries (default 50; 0 shows all)")
    p.set_defaults(handler=run)


def _limit(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: must be a whole number of at least 0")
    return v


def run(args: argparse.Namespace) -> int:
    from ..host.audit import AuditLog

    log = AuditLog()
    limit = getattr(args, "limit", 50)
    entries = log.read(limit=limit or None)
    if getattr(args, "json", False):
        print_json({"schema": SCHEMA, "path": str(log.path), "entries": entries})
    else:
        print_log(entries, str(log.path))
    return 0


_OUTCOME_STYLE = {
    "delivered": "green", "not_running": "dim", "pid_reused": "yellow",
    "permission_denied": "red", "error": "red",
}


def print_log(entries: list[dict[str, Any]], path: str) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from .._parse import format_gpu_list

    console = Console(highlight=False)
    if not entries:
        console.print(f"no signals recorded in {escape(path)}")
        return
    table = Table(box=None, pad_edge=False, collapse_padding=True, header_style="bold")
    for col, just in (("Time", "left"), ("By", "left"), ("Action", "left"), ("Signal", "left"),
                      ("PID", "right"), ("User", "left"), ("Command", "left"), ("GPUs", "left"),
                      ("Outcome", "left")):
        # time, pid, signal and GPUs never break; long commands and outcomes fold
        table.add_column(col, justify=just, overflow="fold" if col in ("Command", "Outcome") else "ellipsis",  # type: ignore[arg-type]
                         no_wrap=col in ("Time", "PID", "Signal", "GPUs", "By", "Action"),
                         min_width=len("delivered") if col == "Outcome" else None)
    for e in entries:
        target = e.get("target") if isinstance(e.get("target"), dict) else {}
        actor = e.get("actor") if isinstance(e.get("actor"), dict) else {}
        gpus = target.get("gpus")
        try:
            gpu_text = format_gpu_list(gpus) if gpus else "-"
        except (TypeError, ValueError):
            gpu_text = str(gpus)
        table.add_row(
            _local_time(e.get("time")), escape(_by(actor)), escape(str(e.get("action") or "-")),
            escape(str(e.get("signal") or "-")), str(target.get("pid", "-")),
            escape(str(target.get("user") or "-")), escape(str(target.get("command") or "-")),
            gpu_text, _outcome_cell(e),
        )
    console.print(table)
    console.print(f"[dim]{len(entries)} entries from {escape(path)}[/]")


def _by(actor: dict[str, Any]) -> str:
    user = str(actor.get("user") or "?")
    sudo = actor.get("sudo_user")
    return f"{user} (sudo {sudo})" if sudo else user


def _outcome_cell(e: dict[str, Any]) -> str:
    from rich.markup import escape

    outcome = e.get("outcome")
    if outcome is None:
        return "[yellow]unknown (run interrupted)[/]"
    text = escape(str(outcome))
    if e.get("outcome_detail"):
        text += f" [dim]{escape(str(e['outcome_detail']))}[/]"
    style = _OUTCOME_STYLE.get(str(outcome))
    return f"[{style}]{text}[/]" if style else text


def _local_time(iso: object) -> str:
    """The stored UTC time as local time, like ``status`` shows times."""
    import calendar
    import time

    if not isinstance(iso, str):
        return "-"
    try:
        epoch = calendar.timegm(time.strptime(iso[:19], "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return iso
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))
