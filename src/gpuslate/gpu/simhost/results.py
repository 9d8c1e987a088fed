"""What ``gpuslate sim init`` and ``gpuslate sim leak`` report (``gpuslate.sim.init.v1``,
``gpuslate.sim.leak.v1``): values with ``to_json``/``from_json``, so that the commands print the same
here and over ``--host`` (the remote document read back into the same result, one renderer)."""

from __future__ import annotations

from typing import Any, NamedTuple

from ..._document import checked, reading
from ...outcome import Outcome, StatusEnum
from .host import SimHost

INIT_SCHEMA = "gpuslate.sim.init.v1"
LEAK_SCHEMA = "gpuslate.sim.leak.v1"


class SimStatus(StatusEnum):
    CREATED = "created", Outcome.DONE  # sim init: the host is there (created, or reset)
    LEAKED = "leaked", Outcome.DONE  # sim leak: the memory is held by no process


class SimInitResult(NamedTuple):
    root: str
    gpus: int
    memory: int
    reserved: int
    name: str
    release_delay: float
    memory_api: str
    host_memory: int | None = None  # None: a document from before host memory was simulated

    @property
    def status(self) -> SimStatus:
        return SimStatus.CREATED

    @classmethod
    def of(cls, host: SimHost) -> SimInitResult:
        cfg = host.config
        return cls(str(host.root), cfg["gpus"], cfg["memory"], cfg["reserved"], cfg["name"], cfg["release_delay"],
                   cfg["memory_api"], cfg["host_memory"])

    def to_json(self) -> dict[str, Any]:
        return {"schema": INIT_SCHEMA, "root": self.root, "gpus": self.gpus, "memory": self.memory,
                "reserved": self.reserved, "name": self.name, "release_delay": self.release_delay,
                "memory_api": self.memory_api, "host_memory": self.host_memory}

    @classmethod
    def from_json(cls, doc: object) -> SimInitResult:
        d = checked(doc, INIT_SCHEMA)
        with reading(INIT_SCHEMA):
            return cls(_str(d["root"]), _int(d["gpus"]), _int(d["memory"]), _int(d["reserved"]), _str(d["name"]),
                       _number(d["release_delay"]), _str(d["memory_api"]),
                       _int(d["host_memory"]) if d.get("host_memory") is not None else None)


class SimLeakResult(NamedTuple):
    gpu: int
    memory: int
    record: str  # the simulated driver's record of the leak

    @property
    def status(self) -> SimStatus:
        return SimStatus.LEAKED

    def to_json(self) -> dict[str, Any]:
        return {"schema": LEAK_SCHEMA, "gpu": self.gpu, "memory": self.memory, "record": self.record}

    @classmethod
    def from_json(cls, doc: object) -> SimLeakResult:
        d = checked(doc, LEAK_SCHEMA)
        with reading(LEAK_SCHEMA):
            return cls(_int(d["gpu"]), _int(d["memory"]), _str(d["record"]))


def _int(v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"expected a whole number, got {v!r}")
    return v


def _number(v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"expected a number, got {v!r}")
    return v


def _str(v: object) -> str:
    if not isinstance(v, str):
        raise TypeError(f"expected a string, got {v!r}")
    return v
