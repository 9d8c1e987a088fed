"""The experiment spec: deployments, roles and a load plan, from a TOML file.

::

    [experiment]
    name = "eagle3-threshold"                      # default: the file's stem
    deployments = ["baseline", "speculative"]      # sweep order; default: the [units.*] of this file, in order
    config = "gpuslate.toml"                       # optional: where deployments not defined here are found
    clear = false                                  # clear the first deployment's GPUs first (as `up --clear`)
    time_scale = 1.0                               # simulated servers' --time-scale: reports unscale by it
    min_margin = 0.0                               # a win must also beat the other side by this fraction
    order = "interleaved"                          # or "blocked": see below
    control_level = 8                              # blocked: the level measured again at the end (default: the first)
    allow_estimated = false                        # recommend from estimated token counts (no usage, no tokenizer)
    num_speculative_tokens = 3                     # K of the reference forms, where the command names none
    verify = 1                                     # then run the recommendation: this many repeats (0: not)

    [roles]                                        # default: deployments named after a role take it
    baseline = "baseline"
    speculative = "speculative"
    "speculative+threshold" = "speculative-t1"

    [load]
    concurrency = [1, 2, 4, 8, 16, 32, 64]
    requests = 64          # per level and repeat (or duration_s)
    repeats = 2
    warmup = 8             # requests before each deployment's first level, not counted
    input_len = 128
    output_len = 128
    api = "completions"    # or "chat"
    seed = 0
    api_key_env = "OPENAI_API_KEY"   # the API key is read from this variable at run time (never in the file)

    [units.baseline]       # exactly as in gpuslate.toml (same parser, same checks)
    command = ["python", "-m", "sglang.launch_server", "--port", "30000"]
    port = 30000
    engine = "sglang"

Order: ``interleaved`` (the default) runs repeat after repeat, each repeat
sweeping every deployment with the order rotated (ABC, BCA, CAB, ...), so that
a machine getting slower or faster over the run (drift) hits every deployment
alike and shows as a change between repeats; ``blocked`` runs each
deployment's repeats back to back (one swap each, for costly real swaps) and
then measures the first deployment's ``control_level`` again at the end: the
change of that control is the drift. The report prints both.

``verify = N``: once every point has run and a threshold is recommended, the
run goes on with the recommendation itself (the speculative deployment with
the written configuration, role ``recommended``) in N more interleaved
repeats, alongside the deployment that won at each level (both where they
tied), and the report says per level whether it matches the better of the two.
``--resume`` may raise ``[load] repeats`` and ``verify``; nothing else may change.

Every error is a UsageError naming ``FILE:LINE``. Nothing here starts anything.
"""

from __future__ import annotations

import enum
import json
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, get_args

from .._toml import line_of, read_toml
from ..errors import UsageError
from ..unitname import MAX_LENGTH, is_unit_name
from ..units.spec import UnitSpec, load_config, resolve
from .plan import LoadPlan

Role = Literal["baseline", "speculative", "speculative+threshold", "recommended"]
#: the role of the recommendation's own run (experiment run's verification), never declared in [roles]
RECOMMENDED: Role = "recommended"


class Order(str, enum.Enum):
    """How an experiment orders its points (see the module docstring)."""

    INTERLEAVED = "interleaved"
    BLOCKED = "blocked"


ROLES: tuple[str, ...] = tuple(r for r in get_args(Role) if r != RECOMMENDED)  # what [roles] may give
MAX_VERIFY = 10
#: the [units.NAME] key of an experiment spec naming a patched engine's own threshold flag
THRESHOLD_FLAG = "threshold_flag"
Api = Literal["completions", "chat"]

# [load] key -> accepted types (bool is never accepted as an int)
_LOAD_TYPES: dict[str, tuple[type, ...]] = {
    "concurrency": (list, int), "request_rate": (int, float), "max_concurrency": (int,), "requests": (int,),
    "duration_s": (int, float), "warmup": (int,), "seed": (int,), "api": (str,), "stream": (bool,),
    "input_len": (int,), "output_len": (int,), "dataset": (str,), "model": (str,), "ignore_eos": (bool,),
    "timeout_s": (int, float), "repeats": (int,), "tokenizer": (str,), "extra_body": (dict,),
    "random_range_ratio": (int, float), "burstiness": (int, float), "api_key_env": (str,), "connection": (str,),
}
_EXPERIMENT_TYPES: dict[str, tuple[type, ...]] = {
    "name": (str,), "deployments": (list,), "config": (str,), "clear": (bool,), "time_scale": (int, float),
    "min_margin": (int, float), "num_speculative_tokens": (int,), "order": (str,), "control_level": (int,),
    "allow_estimated": (bool,), "verify": (int,),
}
_TOP = ("experiment", "roles", "load", "units")
MAX_LEVEL = 100_000


@dataclass(frozen=True)
class Deployment:
    name: str  # as the spec names it (the report's, the points')
    role: Role | None
    unit: UnitSpec  # its unit, named NAMESPACE.NAME (see unit_namespace)
    source: str  # the file that defines the unit
    #: a patched engine's own flag that takes the threshold (``--speculative-disable-batch-threshold``):
    #: the recommendation is then this deployment's command with the flag set to T
    threshold_flag: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "role": self.role, "source": self.source, "command": self.unit.command,
                "unit": self.unit.to_json(), "threshold_flag": self.threshold_flag}


@dataclass(frozen=True)
class ExperimentSpec:
    path: str
    name: str
    deployments: tuple[Deployment, ...]
    levels: tuple[int, ...]
    repeats: int
    load: dict[str, Any]  # LoadPlan keyword arguments, except concurrency
    clear_first: bool = False
    time_scale: float = 1.0
    min_margin: float = 0.0
    num_speculative_tokens: int = 3
    order: Order = Order.INTERLEAVED
    control_level: int | None = None  # blocked order: the level the control re-measures
    allow_estimated: bool = False
    verify: int = 0  # repeats of the recommendation's own run after the sweep (0: none)
    text: str = field(default="", repr=False, compare=False)

    def by_role(self, role: Role) -> Deployment | None:
        return next((d for d in self.deployments if d.role == role), None)

    def identity(self) -> dict[str, Any]:
        """What must not change between a run and its --resume (repeats and verify may grow: see
        :func:`same_experiment`)."""
        return {"deployments": [[d.name, d.role, d.unit.command] for d in self.deployments],
                "levels": list(self.levels), "load": self.load,
                "order": self.order.value, "control_level": self.control_level}

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "name": self.name, "deployments": [d.to_json() for d in self.deployments],
                "levels": list(self.levels), "repeats": self.repeats, "load": self.load,
                "clear_first": self.clear_first, "time_scale": self.time_scale, "min_margin": self.min_margin,
                "num_speculative_tokens": self.num_speculative_tokens, "order": self.order.value,
                "control_level": self.control_level, "allow_estimated": self.allow_estimated,
                "verify": self.verify}


def same_experiment(spec: ExperimentSpec, identity: object, previous: dict[str, Any]) -> str | None:
    """Why ``spec`` cannot resume the run whose manifest holds ``identity`` and spec ``previous``
    (None: it can). Only ``[load] repeats`` and ``[experiment] verify`` may change, and only up."""
    mine = json.loads(json.dumps(spec.identity()))
    theirs = {k: v for k, v in identity.items() if k != "repeats"} if isinstance(identity, dict) else None
    if theirs != mine:
        return "other deployments or another load plan"
    for key, now in (("repeats", spec.repeats), ("verify", spec.verify)):
        before = previous.get(key, 0)
        if isinstance(before, int) and now < before:
            return f"fewer {key} ({now}) than the run had ({before}); --resume may only add"
    return None


def load_spec(path: str | Path) -> ExperimentSpec:
    """Parse and check an experiment spec; UsageError with ``FILE:LINE`` on the first problem."""
    p = Path(path)
    text, doc = read_toml(p, "experiment spec")

    def fail(table: str | None, key: str | None, msg: str) -> UsageError:
        return UsageError(f"{p}:{line_of(text, table, key)}: {msg}")

    for key in doc:
        if key not in _TOP:
            raise fail(None, key, f"unknown table or key {key!r} (known: {', '.join(_TOP)})")
    exp = _table(doc, "experiment", fail)
    _check_types(exp, _EXPERIMENT_TYPES, "experiment", fail)
    load = _table(doc, "load", fail)
    _check_types(load, _LOAD_TYPES, "load", fail)
    roles_t = _table(doc, "roles", fail)

    # the [units.*] tables of this file, checked exactly as gpuslate.toml's (and an experiment's own key)
    own = load_config(p, extra=(THRESHOLD_FLAG,))
    config_path: Path | None = None
    if "config" in exp:
        config_path = (p.parent / exp["config"]).resolve()
        if not config_path.is_file():
            raise fail("experiment", "config", f"config file {config_path} not found")
    names = exp.get("deployments", list(own))
    if not names:
        raise fail("experiment", "deployments", "no deployments: list them in [experiment] deployments "
                   "or define [units.NAME] tables")
    if not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        raise fail("experiment", "deployments", "deployments must be distinct unit names")
    referenced = load_config(config_path) if config_path else {}
    roles = _roles(roles_t, names, fail)
    deployments = []
    for name in names:
        if name in own:
            source, where = p, f"{p}:{line_of(text, 'units.' + name, None)}"
        elif name in referenced and config_path is not None:
            source, where = config_path, f"{config_path}"  # load_config already checked its lines
        else:
            hint = f" or in {config_path}" if config_path else " (or set [experiment] config = \"gpuslate.toml\")"
            raise fail("experiment", "deployments", f"deployment {name!r} is not defined: no [units.{name}] "
                       f"in this file{hint}")
        try:
            unit = resolve(name, config=source, extra=(THRESHOLD_FLAG,) if source == p else ())
        except UsageError as exc:
            raise UsageError(f"{where}: [units.{name}]: {exc}") from None
        if unit.port is None:
            raise UsageError(f"{where}: [units.{name}]: an experiment needs the unit's port to send load to")
        flag = (doc.get("units", {}).get(name) or {}).get(THRESHOLD_FLAG) if source == p else None
        if flag is not None:
            table = f"units.{name}"
            if roles.get(name) != "speculative":
                raise fail(table, THRESHOLD_FLAG, f"{THRESHOLD_FLAG} belongs on the speculative deployment (the one "
                           "whose patched engine takes the threshold), not on "
                           f"{roles.get(name) or 'a deployment without a role'} {name!r}")
            if not re.fullmatch(r"--[A-Za-z0-9][A-Za-z0-9_-]*", flag):
                raise fail(table, THRESHOLD_FLAG, f"{THRESHOLD_FLAG} must be one long option, e.g. "
                           f"--speculative-disable-batch-threshold, got {flag!r}")
        deployments.append(Deployment(name, roles.get(name), unit, str(source), flag))

    levels = _levels(load, fail)
    repeats = load.get("repeats", 1)
    if not 1 <= repeats <= 100:
        raise fail("load", "repeats", f"repeats must be 1..100, got {repeats}")
    plan = {k: v for k, v in load.items() if k not in ("concurrency", "repeats")}
    _check_load(plan, fail)
    if "duration_s" in plan:
        plan["requests"] = None  # LoadPlan: requests=None with a duration
    if "dataset" in plan:  # relative to the spec, not to wherever gpuslate runs
        plan["dataset"] = str((p.parent / plan["dataset"]).resolve())
    try:  # the load generator's own checks too, before any server is started
        LoadPlan(concurrency=levels, **{k: v for k, v in plan.items() if k != "api_key_env"}).validate()
    except UsageError as exc:
        raise fail("load", None, f"[load]: {exc}") from None
    if "request_rate" in plan and len(levels) > 1:
        raise fail("load", "request_rate", "request_rate replaces the concurrency levels: give one or the other")
    time_scale = float(exp.get("time_scale", 1.0))
    if not (math.isfinite(time_scale) and time_scale > 0):
        raise fail("experiment", "time_scale", f"time_scale must be a number > 0, got {time_scale}")
    min_margin = float(exp.get("min_margin", 0.0))
    if not (math.isfinite(min_margin) and 0 <= min_margin < 10):
        raise fail("experiment", "min_margin", f"min_margin must be a fraction >= 0, got {min_margin}")
    nst = exp.get("num_speculative_tokens", 3)
    if not 1 <= nst <= 64:
        raise fail("experiment", "num_speculative_tokens", f"num_speculative_tokens must be 1..64, got {nst}")
    try:
        order = Order(exp.get("order", Order.INTERLEAVED.value))
    except ValueError:
        raise fail("experiment", "order", f"order must be one of {', '.join(o.value for o in Order)}, "
                   f"got {exp['order']!r}") from None
    control = exp.get("control_level")
    if control is not None and control not in levels:
        raise fail("experiment", "control_level", f"control_level {control} is not one of the levels {list(levels)}")
    if order is Order.BLOCKED and control is None:
        control = levels[0]
    verify = exp.get("verify", 0)
    if not 0 <= verify <= MAX_VERIFY:
        raise fail("experiment", "verify", f"verify must be 0..{MAX_VERIFY} (repeats of the recommendation's run), "
                   f"got {verify}")
    if verify and not {"baseline", "speculative"} <= {d.role for d in deployments}:
        raise fail("experiment", "verify", "verify needs a baseline and a speculative deployment (see [roles])")
    name = exp.get("name", p.stem)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}", name):
        raise fail("experiment", "name", f"invalid experiment name {name!r}: letters, digits, '.', '_', '+', '-'")
    deployments = _in_namespace(deployments, unit_namespace(name), fail)
    return ExperimentSpec(str(p), name, tuple(deployments), levels, repeats, plan, exp.get("clear", False),
                          time_scale, min_margin, nst, order, control if order is Order.BLOCKED else None,
                          exp.get("allow_estimated", False), verify, text)


def unit_namespace(experiment: str) -> str:
    """The prefix of an experiment's unit names: its name, '+' written '-' (no unit name has one).

    An experiment's deployments are units of their own, ``NAMESPACE.DEPLOYMENT`` (as docker
    compose names a project's containers after the project): the experiment's ``baseline`` is
    ``eagle3-threshold.baseline``, and never replaces the record (or stops the server) of a
    ``baseline`` unit of yours."""
    return experiment.replace("+", "-")


def _in_namespace(deployments: list[Deployment], namespace: str, fail: Any) -> list[Deployment]:
    out = []
    for d in deployments:
        unit_name = f"{namespace}.{d.name}"
        if not is_unit_name(unit_name):
            raise fail("experiment", "name", f"deployment {d.name!r} runs as unit {unit_name!r}, longer than a "
                       f"unit name may be ({MAX_LENGTH} characters): shorten [experiment] name or the deployment's")
        out.append(replace(d, unit=replace(d.unit, name=unit_name)))
    return out


def _table(doc: dict[str, Any], name: str, fail: Any) -> dict[str, Any]:
    t = doc.get(name, {})
    if not isinstance(t, dict):
        raise fail(None, name, f"{name!r} must be a table ([{name}])")
    return t


def _check_types(table: dict[str, Any], types: dict[str, tuple[type, ...]], tname: str, fail: Any) -> None:
    for key, value in table.items():
        if key not in types:
            raise fail(tname, key, f"unknown key {key!r} in [{tname}] (known: {', '.join(sorted(types))})")
        ok = types[key]
        if not isinstance(value, ok) or (isinstance(value, bool) and bool not in ok):
            raise fail(tname, key, f"{key} in [{tname}] has the wrong type ({type(value).__name__}; "
                       f"expected {' or '.join(t.__name__ for t in ok)})")


def _roles(table: dict[str, Any], names: list[str], fail: Any) -> dict[str, Role]:
    out: dict[str, Role] = {}
    for role, dep in table.items():
        if role not in ROLES:
            raise fail("roles", role, f"unknown role {role!r} (roles: {', '.join(ROLES)})")
        if not isinstance(dep, str) or dep not in names:
            raise fail("roles", role, f"role {role!r} names {dep!r}, which is not one of the deployments "
                       f"({', '.join(names)})")
        if dep in out:
            raise fail("roles", role, f"deployment {dep!r} has two roles")
        out[dep] = role  # type: ignore[assignment]
    for n in names:  # a deployment named after a role takes it, unless the role is given to another
        if n not in out and n in ROLES and n not in table:
            out[n] = n  # type: ignore[assignment]
    return out


def _levels(load: dict[str, Any], fail: Any) -> tuple[int, ...]:
    raw = load.get("concurrency", [1])
    raw = [raw] if isinstance(raw, int) else raw
    if not raw or not all(isinstance(c, int) and not isinstance(c, bool) and 1 <= c <= MAX_LEVEL for c in raw):
        raise fail("load", "concurrency", f"concurrency must be a list of integers 1..{MAX_LEVEL}, got {raw!r}")
    if len(set(raw)) != len(raw):
        raise fail("load", "concurrency", f"concurrency levels repeat: {raw!r}")
    return tuple(raw)


def _check_load(plan: dict[str, Any], fail: Any) -> None:
    def positive(key: str, lo: float = 1) -> None:
        v = plan.get(key)
        if v is not None and not (math.isfinite(v) and v >= lo):
            raise fail("load", key, f"{key} must be >= {lo:g}, got {v!r}")

    for key in ("requests", "input_len", "output_len", "max_concurrency"):
        positive(key)
    for key in ("warmup", "seed"):
        positive(key, 0)
    for key in ("duration_s", "timeout_s", "request_rate"):
        v = plan.get(key)
        if v is not None and not (math.isfinite(v) and v > 0):
            raise fail("load", key, f"{key} must be a number > 0, got {v!r}")
    if plan.get("api", "completions") not in get_args(Api):
        raise fail("load", "api", f"api must be one of {', '.join(get_args(Api))}, got {plan['api']!r}")
    if "requests" in plan and "duration_s" in plan:
        raise fail("load", "duration_s", "give requests or duration_s, not both")
