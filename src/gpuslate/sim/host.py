"""A simulated GPU host stored in a folder.

Layout of ``DIR``::

    host.json           the host: GPU count, names, memory, release delay
    dev/nvidia0 ...     device files; holders keep them open, so the same
    dev/nvidiactl       /proc fd scan that finds real /dev/nvidia* finds them
    dev/nvidia-uvm
    alloc/*.json        one record per (process, GPU) holding memory,
                        or per leaked context (no process)
    alloc/*.dead        when a holder was first seen dead (driver teardown start)

Memory is held by real processes (see :mod:`gpuslate.sim.holder`): a record
counts while its process lives, and for ``release_delay`` seconds after it
was first seen dead, like a driver tearing down a context; never instantly.
"""

from __future__ import annotations

import json
import os
import time
import uuid as uuidlib
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import BackendUnavailable, UsageError
from ..proc.procfs import ProcessId, read_stat

SCHEMA = "gpuslate.simhost.v1"
DEFAULT_NAME = "NVIDIA RTX PRO 6000 Blackwell"
DEFAULT_MEMORY = 97887 * 1024**2  # what the seed host reported per GPU
DRIVER_VERSION = "sim-580.95.05"
#: what an idle H200 reports as driver-reserved (the v1 memory API counts it as used)
V1_DEFAULT_RESERVED = 645 * 1024**2
MEMORY_APIS = ("v2", "v1")


class AllocRecord(NamedTuple):
    gpu: int
    pid: int | None  # None: a leaked context held by no process
    start_ticks: int | None
    bytes: int
    kind: str
    path: Path


class HeldMemory(NamedTuple):
    """A record as the simulated driver accounts for it right now."""

    record: AllocRecord
    alive: bool  # False: the process exited and the driver is still releasing


class SimHost:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).absolute()
        self.dev = self.root / "dev"
        self.alloc = self.root / "alloc"
        self._config: dict[str, Any] | None = None

    # -- creation ---------------------------------------------------------
    @classmethod
    def init(
        cls,
        root: str | os.PathLike[str],
        *,
        gpus: int = 8,
        memory: int = DEFAULT_MEMORY,
        name: str = DEFAULT_NAME,
        release_delay: float = 0.2,
        reserved: int | None = None,
        memory_api: str = "v2",
    ) -> "SimHost":
        """``memory_api="v1"`` simulates a driver before R510: reserved memory
        (default then 645 MiB, like an idle H200) is reported inside 'used'."""
        if memory_api not in MEMORY_APIS:
            raise UsageError(f"invalid --memory-api {memory_api!r}: v2 or v1")
        if reserved is None:
            reserved = V1_DEFAULT_RESERVED if memory_api == "v1" else 0
        if gpus < 1 or gpus > 64:
            raise UsageError(f"invalid --count {gpus}: a simulated host has 1 to 64 GPUs")
        if memory <= 0:
            raise UsageError("invalid --memory: must be more than 0")
        if reserved < 0 or reserved >= memory:
            raise UsageError("invalid --reserved: must be at least 0 and less than --memory")
        if release_delay < 0:
            raise UsageError(f"invalid --release-delay {release_delay}: must not be negative")
        host = cls(root)
        if host.root.exists() and any(host.root.iterdir()) and not (host.root / "host.json").exists():
            raise UsageError(f"refusing to initialise {host.root}: it is not empty and not a simulated host")
        host.root.mkdir(parents=True, exist_ok=True)
        host.dev.mkdir(exist_ok=True)
        host.alloc.mkdir(exist_ok=True)
        for entry in host.alloc.iterdir():  # a new host forgets leaks and records
            entry.unlink()
        # existing device files are kept: a process holding one keeps holding it
        wanted = {f"nvidia{i}" for i in range(gpus)} | {"nvidiactl", "nvidia-uvm"}
        for entry in host.dev.iterdir():
            if entry.name not in wanted:
                entry.unlink()
        for n in wanted:
            (host.dev / n).touch()
        seed = uuidlib.uuid4().hex[:8]
        config = {
            "schema": SCHEMA, "name": name, "gpus": gpus, "memory": memory, "reserved": reserved,
            "release_delay": release_delay, "driver_version": DRIVER_VERSION, "memory_api": memory_api,
            "uuids": [f"GPU-{seed}-5141-4d00-8000-{i:012x}" for i in range(gpus)],
            "created_at": time.time(),
        }
        _atomic_write(host.root / "host.json", json.dumps(config, indent=2))
        return host

    # -- configuration ------------------------------------------------------
    @property
    def config(self) -> dict[str, Any]:
        if self._config is None:
            hint = f"create one with 'gpuslate sim init {self.root}'"
            try:
                is_dir = self.root.is_dir()
            except OSError as exc:  # a name too long, a path through a file: not a host either
                raise BackendUnavailable(f"no simulated host at {self.root}: {exc.strerror}", hint=hint) from None
            if not is_dir:
                what = "does not exist" if not os.path.lexists(self.root) else "is not a folder"
                raise BackendUnavailable(f"no simulated host at {self.root}: it {what}", hint=hint)
            try:
                text = (self.root / "host.json").read_bytes().decode("utf-8")
            except FileNotFoundError:
                raise BackendUnavailable(f"no simulated host at {self.root}", hint=hint) from None
            except (OSError, UnicodeDecodeError) as exc:
                raise BackendUnavailable(f"cannot read {self.root}/host.json: {exc}") from None
            try:
                cfg = json.loads(text)
            except ValueError:
                raise BackendUnavailable(f"{self.root}/host.json is not a gpuslate simulated host") from None
            problem = _config_problem(cfg)
            if problem:
                raise BackendUnavailable(f"{self.root}/host.json is not a valid gpuslate simulated host: {problem}",
                                         hint=f"recreate it with 'gpuslate sim init {self.root}'")
            cfg.setdefault("memory_api", "v2")  # hosts made before the option existed
            self._config = cfg
        return self._config

    @property
    def memory_api(self) -> str:
        return str(self.config["memory_api"])

    @property
    def gpu_count(self) -> int:
        return int(self.config["gpus"])

    @property
    def release_delay(self) -> float:
        return float(self.config["release_delay"])

    def device_path(self, gpu: int) -> Path:
        return self.dev / f"nvidia{gpu}"

    def check_gpus(self, gpus: list[int]) -> None:
        bad = [g for g in gpus if g < 0 or g >= self.gpu_count]
        if bad:
            raise UsageError(
                f"GPU {bad[0]} does not exist: this simulated host has {self.gpu_count} GPUs (0-{self.gpu_count - 1})"
            )

    # -- records --------------------------------------------------------------
    def add_record(self, gpu: int, ident: ProcessId | None, nbytes: int, kind: str = "compute") -> Path:
        if ident is None:
            name = f"g{gpu}.leak.{uuidlib.uuid4().hex[:12]}.json"
        else:
            name = f"g{gpu}.p{ident.pid}.t{ident.start_ticks}.json"
        rec = {"gpu": gpu, "pid": ident.pid if ident else None,
               "start_ticks": ident.start_ticks if ident else None, "bytes": nbytes, "kind": kind}
        path = self.alloc / name
        _atomic_write(path, json.dumps(rec))
        return path

    def leak(self, gpu: int, nbytes: int) -> Path:
        """Leave memory held by no process (an orphaned context) until the next init."""
        self.check_gpus([gpu])
        return self.add_record(gpu, None, nbytes)

    def records(self) -> list[AllocRecord]:
        out: list[AllocRecord] = []
        try:
            names = os.listdir(self.alloc)
        except FileNotFoundError:
            return out
        for name in names:
            if not name.endswith(".json"):
                continue
            path = self.alloc / name
            try:
                rec = json.loads(path.read_text())
            except (FileNotFoundError, ValueError):
                continue  # being written (atomic rename) or collected right now
            out.append(AllocRecord(rec["gpu"], rec["pid"], rec["start_ticks"], rec["bytes"], rec["kind"], path))
        return out

    def held(self, now: float | None = None) -> list[HeldMemory]:
        """Records that still hold memory now, after applying the release delay."""
        now = time.time() if now is None else now
        delay = self.release_delay
        out: list[HeldMemory] = []
        for rec in self.records():
            if rec.pid is None:
                out.append(HeldMemory(rec, True))
                continue
            st = read_stat(rec.pid)
            if st is not None and st.start_ticks == rec.start_ticks and not st.has_exited:
                out.append(HeldMemory(rec, True))
                continue
            dead_at = self._dead_since(rec.path, now)
            if now < dead_at + delay:
                out.append(HeldMemory(rec, False))
            else:
                _unlink(rec.path)
                _unlink(rec.path.with_suffix(".dead"))
        return out

    def _dead_since(self, path: Path, now: float) -> float:
        marker = path.with_suffix(".dead")
        try:
            fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            try:
                return float(marker.read_text() or now)
            except (FileNotFoundError, ValueError):
                return now
        # the first observer of the death fixes when teardown started
        with os.fdopen(fd, "w") as f:
            f.write(repr(now))
        return now


def _config_problem(cfg: object) -> str | None:
    """What is wrong with a parsed ``host.json``, or ``None``: every field is
    checked here so that no later read can fail on a hand-edited or torn file."""
    if not isinstance(cfg, dict) or cfg.get("schema") != SCHEMA:
        return f"schema is not {SCHEMA}"

    def whole(key: str, low: int, high: int | None = None) -> bool:
        v = cfg.get(key)
        return isinstance(v, int) and not isinstance(v, bool) and v >= low and (high is None or v <= high)

    if not whole("gpus", 1, 64):
        return "gpus must be a whole number from 1 to 64"
    if not whole("memory", 1):
        return "memory must be a positive number of bytes"
    if not whole("reserved", 0) or cfg["reserved"] >= cfg["memory"]:
        return "reserved must be a number of bytes below memory"
    delay = cfg.get("release_delay")
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not 0 <= delay <= 1e7:
        return "release_delay must be a number of seconds"
    for key in ("name", "driver_version"):
        if not isinstance(cfg.get(key), str):
            return f"{key} must be a string"
    uuids = cfg.get("uuids")
    if not isinstance(uuids, list) or len(uuids) != cfg["gpus"] or not all(isinstance(u, str) for u in uuids):
        return "uuids must list one string per GPU"
    if cfg.get("memory_api", "v2") not in MEMORY_APIS:
        return "memory_api must be v2 or v1"
    return None


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
