"""What a unit is: its command, GPUs, port and readiness, from ``gpuslate.toml`` or the command line.

A unit declared in ``gpuslate.toml``::

    [units.baseline]
    command = ["python", "-m", "sglang.launch_server", "--port", "30000"]   # or one string
    env = { SGLANG_LOG_LEVEL = "info" }
    gpus = "0-7"              # or [0, 1], or "all"; exported as CUDA_VISIBLE_DEVICES
    port = 30000
    engine = "sglang"         # readiness like the engine (gpuslate.engines: its registry); or ready_url / ready_log
    smoke = true
    start_timeout = 900

Options given on the command line override the file; a command after ``--``
replaces the file's command.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from .._parse import (
    ALL_GPUS,
    format_front,
    parse_front,
    parse_gpu_selection,
    parse_host,
    parse_http_url,
    parse_int,
    parse_seconds,
    selected_gpus,
)
from .._toml import line_of, read_toml
from ..engines.registry import BACKENDS
from ..errors import PermissionDenied, UsageError
from ..options import PARK_WAYS, Containment, ParkWay
from ..unitname import UnitName

CONFIG_NAME = "gpuslate.toml"
#: names the unit file, as COMPOSE_FILE names docker compose's (one file here)
CONFIG_VAR = "GPUSLATE_CONFIG"
#: the engines a unit may name (readiness like the engine): the registry's
ENGINES = tuple(BACKENDS)
CONTAINMENTS = tuple(c.value for c in Containment)


@dataclass
class UnitSpec:
    name: str
    command: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    gpus: list[int] | None = None  # None: every GPU (CUDA_VISIBLE_DEVICES left as it is)
    port: int | None = None
    ready_host: str = "127.0.0.1"  # the address readiness checks use
    engine: str | None = None
    ready_url: str | None = None
    ready_log: str | None = None
    smoke: bool = False
    model: str | None = None  # for --smoke; default: the first model of /v1/models
    start_timeout: float = 900.0
    grace: float = 10.0  # SIGTERM -> SIGKILL when stopping
    stop_timeout: float = 60.0  # stopping, including the GPU memory release
    cwd: str | None = None
    containment: Containment = Containment.AUTO
    # weight files to read into the page cache before a swap stops the old unit;
    # None: detected from the command (--model-path, --model, a model folder); []: none
    prefetch: list[str] | None = None
    # the front clients use ("HOST:PORT"; a port alone is 127.0.0.1's): a real proxy that holds
    # requests while the unit behind it changes (units/front.py); None: no front
    front: str | None = None
    front_hold: float = 900.0  # the most seconds the front holds one request (then it answers 502/503)
    # how park and swap --park park it (options.ParkWay; auto: what its command and processes make possible)
    park: ParkWay = ParkWay.AUTO

    @property
    def front_address(self) -> tuple[str, int] | None:
        return parse_front(self.front) if self.front is not None else None

    @property
    def readiness(self) -> tuple[str, str]:
        """(kind, target): log | http | an engine's name (its readiness paths, the first as the target) |
        tcp. Explicit checks win over the engine's."""
        if self.ready_log:
            return "log", self.ready_log
        if self.ready_url:
            return "http", self.url(self.ready_url)
        if self.engine and self.engine in BACKENDS:
            return self.engine, self.url(BACKENDS[self.engine].readiness.paths[0])
        return "tcp", f"{self.ready_host}:{self.port}"

    def url(self, path: str) -> str:
        if "://" in path:
            return path
        host = f"[{self.ready_host}]" if ":" in self.ready_host else self.ready_host
        return f"http://{host}:{self.port}{path if path.startswith('/') else '/' + path}"

    def validate(self) -> UnitSpec:
        self.name = UnitName(self.name)
        if not self.command:
            raise UsageError(f"unit {self.name!r} has no command: give one after '--' or in {CONFIG_NAME}")
        if self.port is not None and not 1 <= self.port <= 65535:
            raise UsageError(f"invalid port {self.port}: 1 to 65535")
        if self.engine is not None and self.engine not in ENGINES:
            raise UsageError(f"invalid engine {self.engine!r}: one of {', '.join(ENGINES)}")
        if self.containment not in CONTAINMENTS:
            raise UsageError(f"invalid containment {self.containment!r}: one of {', '.join(CONTAINMENTS)}")
        self.containment = Containment(self.containment)
        if self.park not in PARK_WAYS:
            raise UsageError(f"invalid park {self.park!r}: one of {', '.join(PARK_WAYS)}")
        self.park = ParkWay(self.park)
        kind, _ = self.readiness
        if self.port is None and (kind == "tcp" or kind in BACKENDS or self.smoke
                                  or (kind == "http" and "://" not in (self.ready_url or ""))):
            raise UsageError(f"unit {self.name!r} needs a port for its readiness check "
                             "(--port), or a full --ready URL, or --ready-log REGEX")
        if self.ready_log:
            try:
                re.compile(self.ready_log)
            except re.error as exc:
                raise UsageError(f"invalid --ready-log pattern {self.ready_log!r}: {exc}") from None
        if self.front is not None:
            host, fport = parse_front(self.front)
            self.front = format_front(host, fport)
            if fport == self.port:
                raise UsageError(f"unit {self.name!r}: its front cannot listen on the unit's own port {fport}")
        for name in ("start_timeout", "grace", "stop_timeout", "front_hold"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise UsageError(f"invalid {name} {v!r}: a number of seconds, at least 0")
            parse_seconds(v, what=name)
        self._validate_inputs()
        return self

    def _validate_inputs(self) -> None:
        """Everything that would otherwise fail only after the server was launched:
        the address and URL readiness uses, the working folder, the environment."""
        self.ready_host = parse_host(self.ready_host)
        if self.ready_url:
            if "://" in self.ready_url:
                parse_http_url(self.ready_url)
            elif self.port is not None:  # a path: with the unit's address and port
                parse_http_url(self.url(self.ready_url))
        if self.cwd is not None:
            _check_cwd(self.cwd)
        for k, v in self.env.items():
            if not k or "=" in k or "\0" in k or "\0" in v:
                raise UsageError(f"invalid environment variable {k!r}: a name without '=' and no NUL bytes")
        if any("\0" in a for a in self.command):
            raise UsageError("invalid command: an argument contains a NUL byte")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> UnitSpec:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in doc.items() if k in known})


# -- gpuslate.toml ----------------------------------------------------------------

_TYPES: dict[str, tuple[type, ...]] = {
    "command": (list, str), "env": (dict,), "gpus": (list, str, int), "port": (int,), "ready_host": (str,),
    "engine": (str,), "ready_url": (str,), "ready_log": (str,), "smoke": (bool,), "model": (str,),
    "start_timeout": (int, float, str), "grace": (int, float, str), "stop_timeout": (int, float, str),
    "cwd": (str,), "containment": (str,), "prefetch": (list,), "front": (int, str), "front_hold": (int, float, str),
    "park": (str,),
}


def find_config(path: str | os.PathLike[str] | None = None) -> Path | None:
    """The unit file, as docker compose finds its compose file: ``path`` (``--config``), else
    ``$GPUSLATE_CONFIG`` (as ``COMPOSE_FILE``; one file), each of which must exist; else the
    first ``gpuslate.toml`` in the current folder or a folder above it; None when there is none.

    A file found by that walk (not named by the user) decides which commands ``up`` runs, so it
    is used only when it is the user's or root's and nobody else may change it; otherwise it is
    refused (:class:`PermissionDenied`), never skipped: a file planted in ``/tmp`` does not
    quietly stand in for yours, nor hide it.
    """
    if path is not None:
        p = Path(path).expanduser()
        if not p.is_file():
            raise UsageError(f"config file {p} not found")
        return p
    named = os.environ.get(CONFIG_VAR)
    if named:
        p = Path(named).expanduser()
        if not p.is_file():
            more = (" (one file: a list such as COMPOSE_FILE's is not read)" if os.pathsep in named else "")
            raise UsageError(f"{CONFIG_VAR} names {p}, which is not a file{more}",
                             hint=f"unset {CONFIG_VAR}, or point it at your {CONFIG_NAME}")
        return p
    here = Path.cwd()
    for folder in (here, *here.parents):
        p = folder / CONFIG_NAME
        try:
            st = p.stat()
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        _check_found(p, st)
        return p
    return None


def _check_found(p: Path, st: os.stat_result) -> None:
    """A unit file found by walking up: the user's or root's, changeable by nobody else."""
    me = os.geteuid()
    why = None
    if st.st_uid not in (me, 0):
        why = f"it is owned by uid {st.st_uid}, not by you (uid {me}) or root"
    elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        why = f"others may write it (mode {stat.S_IMODE(st.st_mode):o})"
    else:
        try:
            folder = p.parent.stat()
        except OSError as exc:
            why = f"its folder cannot be read: {exc.strerror}"
        else:
            if folder.st_uid not in (me, 0) or (folder.st_mode & stat.S_IWOTH and not folder.st_mode & stat.S_ISVTX):
                why = "its folder is another user's or writable by others"
    if why is not None:
        raise PermissionDenied(f"refusing the unit file {p} found above this folder: {why}",
                               hint=f"name the file you mean with --config PATH or {CONFIG_VAR}")


def load_config(path: Path, *, extra: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    """The ``[units.NAME]`` tables of a config file, each checked; UsageError with the line otherwise.
    ``extra``: string keys a caller reads itself from the file (an experiment's ``threshold_flag``),
    accepted and left out of the units."""
    text, doc = read_toml(path, "unit configuration")
    units = doc.get("units", {})
    if not isinstance(units, dict):
        raise UsageError(f"{path}:{_line_of(text, None, 'units')}: 'units' must be a table of [units.NAME] tables")
    out: dict[str, dict[str, Any]] = {}
    for name, table in units.items():
        where = f"{path}:{_line_of(text, name, None)}"
        if not isinstance(table, dict):
            raise UsageError(f"{where}: units.{name} must be a table")
        unit: dict[str, Any] = {}
        for key, value in table.items():
            line = f"{path}:{_line_of(text, name, key)}"
            if key in extra:
                if not isinstance(value, str):
                    raise UsageError(f"{line}: {key} in [units.{name}] has the wrong type ({_toml_type(value)}; "
                                     "expected str)")
                continue
            if key not in _TYPES:
                raise UsageError(f"{line}: unknown key {key!r} in [units.{name}] "
                                 f"(known: {', '.join(sorted(_TYPES))})")
            if not isinstance(value, _TYPES[key]) or (isinstance(value, bool) and bool not in _TYPES[key]):
                raise UsageError(f"{line}: {key} in [units.{name}] has the wrong type "
                                 f"({_toml_type(value)}; expected {' or '.join(t.__name__ for t in _TYPES[key])})")
            try:
                unit[key] = _normalize(key, value, path)
            except UsageError as exc:
                raise UsageError(f"{line}: {key} in [units.{name}]: {exc}") from None
        out[name] = unit
    return out


def _normalize(key: str, value: Any, path: Path) -> Any:
    """One value of a ``[units.NAME]`` table, checked and in the form UnitSpec takes.

    Raises :class:`UsageError` with what is wrong; the caller adds ``FILE:LINE``.
    """
    if key == "command":
        if isinstance(value, str):
            try:
                value = shlex.split(value)
            except ValueError as exc:  # e.g. 'sleep "5': No closing quotation
                raise UsageError(f"cannot split the command line: {exc}") from None
        if not all(isinstance(a, str) for a in value):
            raise UsageError("must be a string or a list of strings")
        return value
    if key == "gpus":  # "all": every GPU, as when absent
        return selected_gpus(parse_gpu_selection(",".join(map(str, value)) if isinstance(value, list) else str(value)))
    if key == "prefetch" and not all(isinstance(p, str) for p in value):
        raise UsageError("must be a list of paths (strings)")
    if key == "env":
        out: dict[str, str] = {}
        for k, v in value.items():
            # a number or a boolean reads as it is written; a list or a table has no one way to
            if isinstance(v, bool):
                v = "true" if v else "false"
            elif not isinstance(v, (str, int, float)):
                raise UsageError(f"env value of {k!r} must be a string or a number, not a {_toml_type(v)}")
            out[str(k)] = str(v)
        return out
    if key == "cwd":  # relative to the file, not to wherever gpuslate runs
        return _check_cwd(str((path.parent / value).resolve()))
    if key == "front":
        host, port = parse_front(value)
        return format_front(host, port)
    if key in ("start_timeout", "grace", "stop_timeout", "front_hold"):
        return parse_seconds(value, what=key)
    if key == "port":
        return parse_int(str(value), low=1, high=65535, what="port")
    if key == "ready_host":
        return parse_host(value)
    if key == "engine" and value not in ENGINES:
        raise UsageError(f"must be one of {', '.join(ENGINES)}")
    if key == "containment" and value not in CONTAINMENTS:
        raise UsageError(f"must be one of {', '.join(CONTAINMENTS)}")
    if key == "park" and value not in PARK_WAYS:
        raise UsageError(f"must be one of {', '.join(PARK_WAYS)}")
    if key == "ready_url" and "://" in value:
        parse_http_url(value)
    if key == "ready_log":
        try:
            re.compile(value)
        except re.error as exc:
            raise UsageError(f"invalid pattern: {exc}") from None
    return value




def _check_cwd(cwd: str) -> str:
    if not os.path.isdir(cwd):
        what = "does not exist" if not os.path.lexists(cwd) else "is not a folder"
        raise UsageError(f"invalid working directory {cwd!r}: it {what}")
    return cwd


def _toml_type(v: object) -> str:
    names: dict[type, str] = {list: "list", dict: "table"}
    return names.get(type(v), type(v).__name__)


def _line_of(text: str, unit: str | None, key: str | None) -> int:
    """Line of ``[units.UNIT]``, or of ``key`` inside it (1 if not found)."""
    return line_of(text, f"units.{unit}" if unit is not None else None, key)


def resolve(name: str, *, overrides: dict[str, Any] | None = None, command: list[str] | None = None,
            config: str | os.PathLike[str] | None = None, previous: dict[str, Any] | None = None,
            extra: tuple[str, ...] = ()) -> UnitSpec:
    """The spec of unit ``name``: the config file's table (else, when no ``command`` is given,
    ``previous``, the spec it last ran with), then ``overrides`` (options given, not None), then
    ``command`` if given. A new command never inherits the last run's options (its readiness
    check belonged to the old command)."""
    path = find_config(config)
    base: dict[str, Any] | None = None
    if path is not None:
        base = load_config(path, extra=extra).get(name)
    if base is None and previous is not None and not command:
        base = {k: v for k, v in previous.items() if k != "name"}
    if base is None and not command:
        where = f"in {path}" if path else f"no {CONFIG_NAME} here or above, and no {CONFIG_VAR}"
        # said for up and for swap's NEW alike: swap takes no command, so the way is the unit file or an up
        raise UsageError(f"unknown unit {name!r} ({where})",
                         hint=f"declare it as [units.{name}] in {CONFIG_NAME} (docs/units.md), or start it once "
                         f"with its command: gpuslate up {name} --port 30000 -- python -m sglang.launch_server ...")
    doc = dict(base or {})
    doc.update({k: v for k, v in (overrides or {}).items() if v is not None})
    if doc.get("gpus") == ALL_GPUS:  # --gpus all: every GPU, whatever the file says
        doc["gpus"] = None
    if command:
        doc["command"] = list(command)
    doc["name"] = name
    known = {f.name for f in fields(UnitSpec)}
    return UnitSpec(**{k: v for k, v in doc.items() if k in known}).validate()
