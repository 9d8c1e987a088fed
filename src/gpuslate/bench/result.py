"""What ``gpuslate bench`` reports: progress while it runs, and the whole run's result
(``gpuslate.bench.v1``). Pure data, no aiohttp, like :mod:`.plan`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .. import __version__
from .._document import checked, reading
from ..outcome import Outcome, StatusEnum
from .metrics import LevelResult
from .plan import LoadPlan

SCHEMA = "gpuslate.bench.v1"


class BenchStatus(StatusEnum):
    COMPLETE = "complete", Outcome.DONE  # every level ran to its end and no request failed
    PARTIAL = "partial", Outcome.PARTIAL  # some requests failed, or a level stopped early (the server went away)
    FAILED = "failed", Outcome.FAILED  # no request succeeded
    INTERRUPTED = "interrupted", Outcome.INTERRUPTED  # Ctrl-C or SIGTERM: the figures are of what finished


@dataclass(frozen=True)
class Progress:
    """Where a run stands; passed to ``on_progress`` at each level start and request end."""

    level_index: int
    levels: int
    concurrency: int | None
    done: int
    total: int | None
    elapsed_s: float
    warmup: bool = False
    finished: bool = False  # the level (or its warm-up) is over


@dataclass
class BenchResult:
    """A whole run; ``to_json()`` is the ``gpuslate.bench.v1`` document."""

    url: str
    model: str | None  # None: interrupted before the server named it
    api: str
    started_at: str
    plan: LoadPlan
    server: dict[str, Any] = field(default_factory=dict)
    levels: list[LevelResult] = field(default_factory=list)
    interrupted: bool = False
    in_flight: list[dict[str, Any]] = field(default_factory=list)  # abandoned by an interrupt
    warnings: list[str] = field(default_factory=list)
    gpuslate_version: str = __version__  # of the gpuslate that ran it (another, read from a host's document)

    @property
    def ok(self) -> bool:
        """Every level ran to its end and no request failed."""
        return not self.interrupted and bool(self.levels) and all(
            lv.failed == 0 and lv.completed > 0 for lv in self.levels)

    @property
    def status(self) -> BenchStatus:
        if self.interrupted:
            return BenchStatus.INTERRUPTED
        if not any(lv.completed for lv in self.levels):
            return BenchStatus.FAILED
        if any(lv.stopped_early for lv in self.levels) or not self.ok:
            return BenchStatus.PARTIAL
        return BenchStatus.COMPLETE

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "gpuslate_version": self.gpuslate_version, "url": self.url,
                "model": self.model, "api": self.api, "started_at": self.started_at,
                "plan": self.plan.to_json(), "server": self.server, "ok": self.ok,
                "interrupted": self.interrupted, "in_flight": list(self.in_flight),
                "warnings": list(self.warnings), "levels": [lv.to_json() for lv in self.levels]}

    @classmethod
    def from_json(cls, doc: object) -> BenchResult:
        """A ``gpuslate.bench.v1`` document as the BenchResult it was (the plan without header values
        or API key: see :meth:`LoadPlan.from_json`)."""
        d = checked(doc, SCHEMA)
        with reading(SCHEMA):
            server, in_flight, warnings = d["server"], d["in_flight"], d["warnings"]
            if not isinstance(server, dict) or not isinstance(in_flight, list) \
                    or not all(isinstance(r, dict) for r in in_flight) or not isinstance(warnings, list):
                raise TypeError("server, in_flight, warnings: expected an object, a list of objects, a list")
            for r in in_flight:  # what the table shows of each
                format(r["elapsed_s"], ".2f")
                if isinstance(r["chunks_received"], bool) or not isinstance(r["chunks_received"], int):
                    raise TypeError(f"in_flight: chunks_received: expected a count, got {r['chunks_received']!r}")
            return cls(str(d["url"]), d["model"], str(d["api"]), str(d["started_at"]), LoadPlan.from_json(d["plan"]),
                       dict(server), [LevelResult.from_json(lv) for lv in d["levels"]], bool(d["interrupted"]),
                       list(in_flight), [str(w) for w in warnings], str(d["gpuslate_version"]))
