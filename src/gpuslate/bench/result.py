"""What ``gpuslate bench`` reports: progress while it runs, and the whole run's result
(``gpuslate.bench.v1``). Pure data, no aiohttp, like :mod:`.plan`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .. import __version__
from .metrics import LevelResult
from .plan import LoadPlan


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

    @property
    def ok(self) -> bool:
        """Every level ran to its end and no request failed."""
        return not self.interrupted and bool(self.levels) and all(
            lv.failed == 0 and lv.completed > 0 for lv in self.levels)

    def to_json(self) -> dict[str, Any]:
        return {"schema": "gpuslate.bench.v1", "gpuslate_version": __version__, "url": self.url,
                "model": self.model, "api": self.api, "started_at": self.started_at,
                "plan": self.plan.to_json(), "server": self.server, "ok": self.ok,
                "interrupted": self.interrupted, "in_flight": list(self.in_flight),
                "warnings": list(self.warnings), "levels": [lv.to_json() for lv in self.levels]}
