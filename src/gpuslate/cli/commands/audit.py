"""``gpuslate audit``: every signal gpuslate sent, and what became of it.

``gpuslate log`` is its old name (too close to ``logs``, a unit's output): a
hidden alias that says so on stderr and keeps its ``gpuslate.log.v1`` document.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, NamedTuple

from ..._document import checked, reading
from ...outcome import Outcome, StatusEnum
from ..exits import exit_epilog
from . import present
from .common import add_common, note

SCHEMA = "gpuslate.audit.v1"
OLD_SCHEMA = "gpuslate.log.v1"  # the same document under the command's old name


class AuditStatus(StatusEnum):
    LISTED = "listed", Outcome.DONE


class AuditListing(NamedTuple):
    """The result of ``audit``: the newest entries of the audit log, as stored."""

    path: str
    entries: list[dict[str, Any]]
    old_name: bool = False  # asked for as 'gpuslate log': the document keeps its old schema
    #: when none is shown: the simulated hosts (their folders) whose entries this file holds
    other_sims: tuple[str, ...] = ()

    @property
    def status(self) -> AuditStatus:
        return AuditStatus.LISTED

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"schema": OLD_SCHEMA if self.old_name else SCHEMA, "path": self.path,
                               "entries": self.entries}
        if self.other_sims:
            doc["other_sims"] = list(self.other_sims)
        return doc

    @classmethod
    def from_json(cls, doc: object) -> AuditListing:
        old = isinstance(doc, dict) and doc.get("schema") == OLD_SCHEMA
        d = checked(doc, OLD_SCHEMA if old else SCHEMA)
        with reading(d["schema"]):
            entries = d["entries"]
            if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
                raise TypeError("entries: not a list of objects")
            others = d.get("other_sims", [])
            if not isinstance(others, list) or not all(isinstance(x, str) for x in others):
                raise TypeError("other_sims: not a list of folders")
            return cls(str(d["path"]), entries, old, tuple(others))


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
    from ...host.audit import AuditLog, of_host  # lazy: startup

    alias = getattr(args, "audit_alias", False)
    if alias:
        note("'gpuslate log' is now 'gpuslate audit' (the old name will go away)")
    sim = getattr(args, "sim", None) or os.environ.get("GPUSLATE_SIM") or None
    log = AuditLog(sim_root=sim)
    limit = getattr(args, "limit", 50)
    entries = log.read(limit=limit or None, where=of_host(log.sim_root))
    # none of this host's: say whose the file holds (a state folder shared by a simulated host)
    others = () if entries or log.sim_root else tuple(dict.fromkeys(
        str(e["sim"]) for e in log.read(where=lambda e: e.get("backend") == "sim" and isinstance(e.get("sim"), str))))
    listing = AuditListing(str(log.path), entries, alias, others)
    return present(args, listing)
