"""The ``audit`` verb: the newest entries of the audit log (host/audit.py) about this host, as an
:class:`AuditListing`, the ``gpuslate.audit.v1`` document (``gpuslate.log.v1`` under the command's
old name). Apart from the log's writer, which ``clear`` loads at every start."""

from __future__ import annotations

from typing import Any, NamedTuple

from .._document import checked, reading
from ..errors import UsageError
from ..options import AuditOptions
from ..outcome import Outcome, StatusEnum
from .audit import AuditLog, of_host

SCHEMA = "gpuslate.audit.v1"
OLD_SCHEMA = "gpuslate.log.v1"  # the same document under the command's old name (gpuslate log)


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


def check_limit(limit: int) -> int:
    """``limit``, a whole number of at least 0 (:class:`~gpuslate.errors.UsageError` otherwise)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise UsageError(f"invalid audit limit {limit!r}: must be a whole number of at least 0")
    return limit


def list_entries(log: AuditLog, options: AuditOptions) -> AuditListing:
    """The ``audit`` verb: the newest ``options.limit`` entries of ``log`` about its host (a
    simulated host's own, or the driver's); when there are none, the simulated hosts whose
    entries the file holds (a state folder shared by a simulated host)."""
    limit = check_limit(options.limit)
    entries = log.read(limit=limit or None, where=of_host(log.sim_root))
    others = () if entries or log.sim_root else tuple(dict.fromkeys(
        str(e["sim"]) for e in log.read(where=lambda e: e.get("backend") == "sim" and isinstance(e.get("sim"), str))))
    return AuditListing(str(log.path), entries, options.old_name, others)
