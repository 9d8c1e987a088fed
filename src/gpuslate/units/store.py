"""Unit state on disk: ``STATE/units/NAME.json``, one file per unit, written atomically.

``STATE`` is the state folder of the host context the command runs on
(:meth:`~gpuslate.host.session.HostContext.state_dir`): a :class:`UnitStore`
is made from it (:meth:`UnitStore.of`), so one ``Host`` reads and writes the
unit records, the logs and the audit log of one state folder, whatever the
environment says meanwhile.

The record is what lets any later gpuslate process (``ps``, ``down``, ``swap``)
find a unit's processes after the ``up`` that started it has exited: the main
process's identity (pid + start time), its process group and session, its
cgroup, and the processes seen in it once it was ready.

Beside it, ``STATE/units/seen/NAME.json`` keeps the identities (pid + start
time) of the processes found in the unit, by a tie that proves it (cgroup,
session or group with a witness, descendance, its instance's marker), at each
scan that looks: readiness, every ``ps`` and ``down`` (:meth:`UnitStore.record_seen`).
An identity never names another process, so what was proven once stays proven
for that process's life: a worker that later calls ``setsid`` and renames
itself over its environment is still the unit's. The file is the unit
instance's (its id inside: another instance's is ignored), kept apart from the
record so that a torn record does not lose it, merged under an ``flock`` of its
folder, and holds only identities still alive when it is written.

Every file here is reached through the state folder's checked walk
(host/statedir.py: from ``/``, one component at a time, never through another
user's link, regular files only) and named only by a :class:`~gpuslate.unitname.UnitName`,
so no name or planted file leads a record read or write outside ``units/``.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ..errors import PermissionDenied
from ..host.statedir import StateDir, open_dir
from ..options import Containment
from ..proc.procfs import ProcessId, boot_id, is_alive
from ..unitname import UnitName, is_unit_name
from .state import Phase

if TYPE_CHECKING:
    from ..host.session import HostContext

SCHEMA = "gpuslate.unit.v1"

#: phases recorded by up/down; ``ps`` derives the state from them and what lives (units/state.py)
STARTING, READY, FAILED, STOPPED = Phase.STARTING, Phase.READY, Phase.FAILED, Phase.STOPPED
CONTAINMENTS = tuple(c.value for c in Containment if c is not Containment.AUTO)  # what a unit got
INSTANCE_RE = re.compile(r"[0-9a-f]{32}")


@dataclass
class UnitRecord:
    name: str
    spec: dict[str, Any]
    phase: Phase
    pid: int
    start_ticks: int
    pgid: int
    sid: int
    containment: Containment  # cgroup | scope | session
    cgroup: str | None  # cgroup v2 path (relative to the mount) when contained in one
    log: str
    gpus: list[int]
    port: int | None
    env: dict[str, str]  # what gpuslate added to the caller's environment
    launched_at: float  # epoch seconds
    ready_at: float | None = None
    time_to_ready_s: float | None = None
    stopped_at: float | None = None
    exit_code: int | None = None
    failure: str | None = None
    members: list[list[int]] = field(default_factory=list)  # [pid, start_ticks] seen while ready
    launched_by: dict[str, Any] = field(default_factory=dict)
    #: 128 random bits (hex) made at launch and put in the unit's environment as GPUSLATE_UNIT_ID:
    #: what tells this unit's processes from those of a unit of the same name of another user or
    #: state folder. "" in records from before instance ids (their processes carry none).
    instance: str = ""
    #: the boot it was launched in (procfs.boot_id): its identities (main, members) mean nothing in another; ""
    #: in records from before it (trusted as before)
    boot: str = ""

    @property
    def ident(self) -> ProcessId:
        return ProcessId(self.pid, self.start_ticks)

    @property
    def member_ids(self) -> list[ProcessId]:
        return [ProcessId(p, t) for p, t in self.members]

    def to_json(self) -> dict[str, Any]:
        # the instance and the boot right after the name: a record torn by a crash still shows them
        return {"schema": SCHEMA, "name": self.name, "instance": self.instance, "boot": self.boot, **asdict(self)}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> UnitRecord:
        """The record in ``doc``; :class:`CorruptRecord` when a field is missing or of the wrong type
        (a record is trusted to name processes to signal: nothing in it is guessed)."""
        if not isinstance(doc, dict):
            raise CorruptRecord(f"not a JSON object but {type(doc).__name__}")
        if doc.get("schema") != SCHEMA:
            raise CorruptRecord(f"schema {doc.get('schema')!r}, expected {SCHEMA!r}")
        for f in fields(cls):
            if f.name not in doc:
                if f.default is not MISSING or f.default_factory is not MISSING:
                    continue
                raise CorruptRecord(f"field {f.name!r} is missing")
            check = _CHECKS[f.name]
            if not check(doc[f.name]):
                raise CorruptRecord(f"field {f.name!r} is invalid: {_short(doc[f.name])}")
        rec = cls(**{f.name: doc[f.name] for f in fields(cls) if f.name in doc})
        rec.phase, rec.containment = Phase(rec.phase), Containment(rec.containment)
        return rec


class CorruptRecord(ValueError):
    """A unit record that cannot be trusted (torn, hand-edited, from another version)."""


def _int(v: Any, low: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v


def _opt(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or check(v)


def _str(v: Any) -> bool:
    return isinstance(v, str)


def _strs(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(a, str) for a in v)


_SPEC_CHECKS: dict[str, Callable[[Any], bool]] = {
    "name": _str, "command": lambda v: _strs(v) and bool(v),
    "env": lambda v: isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, str) for k, x in v.items()),
    "gpus": _opt(lambda v: isinstance(v, list) and all(_int(g) for g in v)), "port": _opt(_int), "ready_host": _str,
    "engine": _opt(_str), "ready_url": _opt(_str), "ready_log": _opt(_str), "smoke": lambda v: isinstance(v, bool),
    "model": _opt(_str), "start_timeout": _num, "grace": _num, "stop_timeout": _num, "cwd": _opt(_str),
    "containment": _str, "front": _opt(_str), "front_hold": _num,
}


def _spec(v: Any) -> bool:
    """The spec the unit last ran with: ``up NAME`` may run it again, so its types are checked too
    (its values, e.g. a port range, by ``UnitSpec.validate`` when it is loaded)."""
    return (isinstance(v, dict) and "command" in v
            and all(check(v[k]) for k, check in _SPEC_CHECKS.items() if k in v))


_CHECKS: dict[str, Callable[[Any], bool]] = {
    "name": lambda v: isinstance(v, str) and bool(v),
    "spec": _spec,
    "phase": lambda v: isinstance(v, str) and v in {p.value for p in Phase},
    "pid": lambda v: _int(v, 1), "start_ticks": _int, "pgid": lambda v: _int(v, 1), "sid": lambda v: _int(v, 1),
    "containment": lambda v: isinstance(v, str) and v in CONTAINMENTS,
    "cgroup": _opt(lambda v: isinstance(v, str) and v.startswith("/") and ".." not in v.split("/")),
    "log": lambda v: isinstance(v, str) and bool(v),
    "gpus": lambda v: isinstance(v, list) and all(_int(g) for g in v),
    "port": _opt(lambda v: _int(v, 1) and v <= 65535),
    "env": lambda v: isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, str) for k, x in v.items()),
    "launched_at": _num, "ready_at": _opt(_num), "time_to_ready_s": _opt(_num), "stopped_at": _opt(_num),
    "exit_code": _opt(lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "failure": _opt(lambda v: isinstance(v, str)),
    "members": lambda v: isinstance(v, list) and all(
        isinstance(m, list) and len(m) == 2 and _int(m[0], 1) and _int(m[1]) for m in v),
    "launched_by": lambda v: isinstance(v, dict),
    "instance": lambda v: isinstance(v, str) and (v == "" or INSTANCE_RE.fullmatch(v) is not None),
    "boot": lambda v: isinstance(v, str) and len(v) <= 64,
}


def _short(v: Any) -> str:
    text = json.dumps(v)
    return text if len(text) <= 60 else text[:57] + "..."


class Unreadable(NamedTuple):
    """A record file that exists but is not a valid record: why, and what could still be read of it."""

    path: Path
    reason: str
    salvage: dict[str, Any]  # pid, start_ticks, port, cgroup, launched_at, gpus, instance: each only if it reads as one


_SALVAGE = {"pid": r'"pid"\s*:\s*(\d+)', "start_ticks": r'"start_ticks"\s*:\s*(\d+)',
            "port": r'"port"\s*:\s*(\d+)', "cgroup": r'"cgroup"\s*:\s*"(/[^"\\]*)"',
            "launched_at": r'"launched_at"\s*:\s*(\d+(?:\.\d+)?)', "instance": r'"instance"\s*:\s*"([0-9a-f]{32})"',
            "boot": r'"boot"\s*:\s*"([0-9a-f-]{36})"'}


def salvage(text: str) -> dict[str, Any]:
    """Fields of a torn record that still read whole. ``port`` and ``gpus`` may come from the
    spec (written before the top-level fields): the same port, GPUs as asked for (the last
    list seen is the resolved one when it is there)."""
    out: dict[str, Any] = {}
    lists = re.findall(r'"gpus"\s*:\s*\[([\d,\s]*)\]', text)
    if lists:
        out["gpus"] = [int(g) for g in lists[-1].replace(",", " ").split()]
    for key, pattern in _SALVAGE.items():
        m = re.search(pattern, text)
        if m:
            v = m.group(1)
            out[key] = v if key in ("cgroup", "instance", "boot") else float(v) if key == "launched_at" else int(v)
    if "cgroup" in out and ".." in out["cgroup"].split("/"):
        del out["cgroup"]
    return out


def salvage_doc(doc: dict[str, Any]) -> dict[str, Any]:
    """The fields of a record that parses but is invalid that are still valid one by one."""
    keys = ("pid", "start_ticks", "port", "cgroup", "launched_at", "gpus", "instance", "boot")
    return {k: doc[k] for k in keys if k in doc and doc[k] is not None and _CHECKS[k](doc[k])}


class UnitStore:
    """The unit records and logs of one state folder (``state/units``, ``state/units/logs``).

    Holds only the folder's path: every use walks it again from ``/`` and checks it
    (host/statedir.py), so a folder swapped meanwhile is refused, never followed.
    """

    def __init__(self, state: Path, folder: str = "units") -> None:
        self.state = state
        self.folder = folder  # "units"; "fronts" for the processes of the fronts (units/front.py)

    @classmethod
    def of(cls, host: HostContext) -> UnitStore:
        """The units of ``host``'s state folder."""
        return cls(host.state_dir())

    def _units(self) -> StateDir:
        """``state/units`` (or the store's folder), walked from ``/`` and checked (host/statedir.py), held open."""
        with open_dir(self.state, create=True) as state:
            return state.subdir(self.folder, create=True)

    def units_dir(self) -> Path:
        with self._units() as units:
            return units.path

    def mark(self) -> str:
        """This state folder as units launched from it carry it (``GPUSLATE_UNIT_STATE``)."""
        return os.path.realpath(self.units_dir())

    def record_path(self, name: str) -> Path:
        """Where unit ``name``'s record is (for messages); :class:`UsageError` for an invalid name."""
        return self.units_dir() / _file(name)

    def log_path(self, name: str) -> Path:
        file = f"{UnitName(name)}.log"
        with self._units() as units, units.subdir("logs", create=True) as logs:
            return logs.path / file

    def save(self, rec: UnitRecord) -> None:
        file = _file(rec.name)
        with self._units() as units:
            try:
                # atomic (readers see the old record or the new one, never half), never through a symlink
                units.write_atomic(file, json.dumps(rec.to_json(), indent=2).encode())
            except PermissionDenied:
                raise
            except OSError as exc:
                raise PermissionDenied(f"cannot write unit state {units.path / file}: "
                                       f"{exc.strerror or exc}") from None

    def read(self, name: str) -> UnitRecord | Unreadable | None:
        """Unit ``name``'s record; :class:`Unreadable` (with the reason) when the file is not a valid
        record; None when there is none. Never raises for what the file contains; raises
        :class:`PermissionDenied` when it is not a regular file of ours (a FIFO, a link, a device:
        never opened in a way that could hang or lead elsewhere), :class:`UsageError` for an
        invalid name."""
        file = _file(name)
        with self._units() as units:
            path = units.path / file
            try:
                fd = units.open(file, os.O_RDONLY)
            except FileNotFoundError:
                return None
            except PermissionDenied:
                raise
            except OSError as exc:
                return Unreadable(path, f"cannot open: {exc.strerror or exc}", {})
        with os.fdopen(fd, "rb") as f:
            raw = f.read(1 << 20)
        text = raw.decode("utf-8", "replace")
        try:
            doc = json.loads(text)
        except ValueError as exc:
            return Unreadable(path, f"not valid JSON ({exc})", salvage(text))
        try:
            rec = UnitRecord.from_json(doc)
        except CorruptRecord as exc:
            return Unreadable(path, str(exc), salvage_doc(doc) if isinstance(doc, dict) else {})
        if rec.name != name:
            return Unreadable(path, f"names unit {rec.name!r}, not {name!r}", {})
        return rec

    def write_file(self, file: str, data: bytes) -> Path:
        """Write ``file`` (a plain name) in the store's folder atomically, never through a link."""
        with self._units() as units:
            try:
                units.write_atomic(file, data)
            except PermissionDenied:
                raise
            except OSError as exc:
                raise PermissionDenied(f"cannot write {units.path / file}: {exc.strerror or exc}") from None
            return units.path / file

    def read_file(self, file: str, limit: int = 1 << 20) -> bytes | None:
        """``file`` of the store's folder (at most ``limit`` bytes); None when there is none."""
        with self._units() as units:
            try:
                fd = units.open(file, os.O_RDONLY)
            except FileNotFoundError:
                return None
        with os.fdopen(fd, "rb") as f:
            return f.read(limit)

    def load(self, name: str) -> UnitRecord | None:
        """Unit ``name``'s record if it is valid (see :meth:`read` for why it is not)."""
        rec = self.read(name)
        return rec if isinstance(rec, UnitRecord) else None

    def names(self) -> list[str]:
        """Every unit with a record file, valid or not (files whose name no unit can have are not units)."""
        with self._units() as units:
            return sorted(n[:-5] for n in units.names() if n.endswith(".json") and is_unit_name(n[:-5]))

    def remove(self, name: str) -> list[Path]:
        """Remove unit ``name``'s record and its logs (``NAME.log``, the rotated ``NAME.log.N``, their
        line times): what ``rm`` does to a unit nothing of which runs. The files removed."""
        file = _file(name)
        logs = re.compile(re.escape(f"{UnitName(name)}.log") + r"(\.[1-9][0-9]*)?(\.times)?")
        removed: list[Path] = []

        def unlink(folder: StateDir, n: str) -> None:
            try:
                folder.unlink(n)
            except FileNotFoundError:
                return
            except OSError as exc:
                raise PermissionDenied(f"cannot remove {folder.path / n}: {exc.strerror or exc}") from None
            removed.append(folder.path / n)

        with self._units() as units:
            unlink(units, file)
            try:
                with units.subdir(SEEN_DIR) as seen:
                    seen.unlink(file)  # what was recorded of its processes: nothing of it runs
            except FileNotFoundError:
                pass
            try:
                folder = units.subdir("logs")
            except FileNotFoundError:
                return removed
            with folder:
                for n in sorted(folder.names()):
                    if logs.fullmatch(n):
                        unlink(folder, n)
        return removed

    def set_aside(self, path: Path) -> Path:
        """Move a corrupt record out of the way (kept beside, for a human to look at)."""
        file = _file(path.name[:-5]) if path.name.endswith(".json") else _file(path.name)
        dest = f".{file}.corrupt.{int(time.time())}"
        with self._units() as units:
            try:
                units.rename(file, dest)
            except OSError as exc:
                raise PermissionDenied(f"cannot move corrupt record {units.path / file} aside: "
                                       f"{exc.strerror or exc}") from None
            return units.path / dest


    # -- identities seen in a unit (module doc) ------------------------------------------------------

    def seen(self, name: str, instance: str) -> frozenset[ProcessId]:
        """The identities recorded as unit ``name``'s instance ``instance`` (none for another instance's
        file, a file that does not read, or an unknown instance ``""``)."""
        if not instance or not boot_id():
            return frozenset()
        try:
            with self._units() as units, units.subdir(SEEN_DIR, create=True) as seen:
                raw = seen.read(_file(name), limit=SEEN_BYTES)
        except (PermissionDenied, OSError):
            return frozenset()
        return _parse_seen(raw, instance)

    def record_seen(self, name: str, instance: str, idents: Iterable[ProcessId]) -> None:
        """Add ``idents`` (found in unit ``name``'s instance ``instance`` by a tie that proves it) to
        what is recorded, less the identities no longer alive; written only when that changes it."""
        if not instance or not boot_id():
            return
        new = set(idents)
        file = _file(name)
        with self._units() as units, units.subdir(SEEN_DIR, create=True) as seen:
            fcntl.flock(seen.fd, fcntl.LOCK_EX)  # two scans at once merge, never lose each other's
            try:
                before = _parse_seen(seen.read(file, limit=SEEN_BYTES), instance)
            except (PermissionDenied, OSError):
                before = frozenset()
            keep = {i for i in before | new if is_alive(i)}
            if keep == before:
                return
            kept = sorted(keep, key=lambda i: (i.start_ticks, i.pid))[-SEEN_MAX:]
            doc = {"schema": SEEN_SCHEMA, "instance": instance, "boot": boot_id(),
                   "seen": [[i.pid, i.start_ticks] for i in kept]}
            try:
                seen.write_atomic(file, json.dumps(doc).encode())
            except OSError as exc:
                raise PermissionDenied(f"cannot write {seen.path / file}: {exc.strerror or exc}") from None


#: the folder of ``units`` where the identities seen in each unit are kept, and their format
SEEN_DIR = "seen"
SEEN_SCHEMA = "gpuslate.unit-seen.v1"
#: the most identities kept for one unit (the newest), and the most of the file read
SEEN_MAX = 4096
SEEN_BYTES = 1 << 20


def _parse_seen(raw: bytes | None, instance: str) -> frozenset[ProcessId]:
    """The identities of a seen file of instance ``instance``; none when it is another's or does not read."""
    if raw is None:
        return frozenset()
    try:
        doc = json.loads(raw)
    except ValueError:
        return frozenset()
    if not isinstance(doc, dict) or doc.get("schema") != SEEN_SCHEMA or doc.get("instance") != instance \
            or doc.get("boot") != boot_id():  # another boot's identities name other processes now
        return frozenset()
    seen = doc.get("seen")
    if not isinstance(seen, list):
        return frozenset()
    return frozenset(ProcessId(m[0], m[1]) for m in seen[:SEEN_MAX]
                     if isinstance(m, list) and len(m) == 2 and _int(m[0], 1) and _int(m[1]))


def _file(name: str) -> str:
    return f"{UnitName(name)}.json"
