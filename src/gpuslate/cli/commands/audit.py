"""``gpuslate audit``: every signal gpuslate sent, and what became of it.

``gpuslate log`` is its old name (too close to ``logs``, a unit's output): a
hidden alias that says so on stderr and keeps its ``gpuslate.log.v1`` document.
"""

from __future__ import annotations

import argparse

from ..exits import exit_epilog
from . import present
from .common import add_common, note


def register(sub: argparse._SubParsersAction) -> None:
    description = ("Show the audit log (newest last): who sent which signal to which process on which GPUs, "
                   "and the outcome. An entry without an outcome belongs to a run that was interrupted after "
                   "recording it. With a simulated host (--sim or GPUSLATE_SIM), only its entries.")
    epilog = exit_epilog({5: "the audit log or its folder is unsafe or unreadable"}, backend=False)
    p = sub.add_parser("audit", help="show the audit log of every signal gpuslate sent",
                       description=description, epilog=epilog)
    old = sub.add_parser("log", description=description, epilog=epilog)  # no help=: hidden from the list
    for parser, alias in ((p, False), (old, True)):
        add_common(parser)
        parser.add_argument("--limit", type=_limit, default=50, metavar="N",
                            help="show the newest N entries (default 50; 0 shows all)")
        parser.set_defaults(handler=run, audit_alias=alias)


def _limit(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: must be a whole number of at least 0")
    return v


def run(args: argparse.Namespace) -> int:
    from ...api import Host  # lazy: startup
    from ...host.auditlist import AuditOptions  # lazy: startup

    alias = getattr(args, "audit_alias", False)
    if alias:
        note("'gpuslate log' is now 'gpuslate audit' (the old name will go away)")
    with Host.open(getattr(args, "sim", None)) as host:  # its state folder; no GPU is needed
        listing = host.audit(AuditOptions(limit=getattr(args, "limit", 50), old_name=alias))
    return present(args, listing)
