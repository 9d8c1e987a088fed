"""What ``gpuslate sim init`` and ``gpuslate sim leak`` report (``gpuslate.sim.init.v1``,
``gpuslate.sim.leak.v1``): values with ``to_json``/``from_json``, so that the commands print the same
here and over ``--host`` (the remote document read back into the same result, one renderer)."""

from __future__ import annotations

from typing import Any, NamedTuple

from ..._document import MAX_GPU, Fields, checked, reading
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
        f = Fields(checked(doc, INIT_SCHEMA))
        with reading(INIT_SCHEMA):
            return cls(f.text("root"), f.integer("gpus", 1, MAX_GPU + 1, what="a GPU count"), f.size("memory"),
                       f.size("reserved"), f.text("name"), f.seconds("release_delay"), f.text("memory_api"),
                       f.opt_size("host_memory", default=None))


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
        f = Fields(checked(doc, LEAK_SCHEMA))
        with reading(LEAK_SCHEMA):
            return cls(f.gpu("gpu"), f.size("memory"), f.text("record"))
