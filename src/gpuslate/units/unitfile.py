"""``gpuslate config``: the unit file checked and shown resolved, as ``docker compose config``.

Every unit of the file is resolved as ``up NAME`` resolves it (:func:`~.spec.resolve`: the file's
table, its values checked and normalized, the defaults filled in, ``cwd`` made absolute), so a
mistake anywhere in the file is found before anything is started, with its ``FILE:LINE``, and what
each unit will run with is shown whole: the TOML it is (which reads back as the same units:
:func:`toml_text`) or the ``gpuslate.config.v1`` document.
"""

from __future__ import annotations

import json
import os
from typing import Any, NamedTuple

from .._document import Fields, Malformed, checked, reading, string
from .._parse import format_gpu_list
from ..errors import UsageError
from ..options import Containment
from ..outcome import Outcome, StatusEnum
from .spec import CONFIG_NAME, CONFIG_VAR, UnitSpec, find_config, load_config, resolve

SCHEMA = "gpuslate.config.v1"


class ConfigStatus(StatusEnum):
    VALID = "valid", Outcome.DONE  # every unit of the file resolves (what a broken one is: exit 2, no document)


class ConfigResult(NamedTuple):
    """The unit file ``path`` and every unit of it, resolved, in the file's order."""

    path: str
    units: list[UnitSpec]

    @property
    def status(self) -> ConfigStatus:
        return ConfigStatus.VALID

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "path": self.path, "units": [u.to_json() for u in self.units]}

    @classmethod
    def from_json(cls, doc: object) -> ConfigResult:
        f = Fields(checked(doc, SCHEMA))
        with reading(SCHEMA):
            return cls(f.text("path"), f.items("units", _spec))


def _spec(doc: object) -> UnitSpec:
    """A resolved unit of another host's document, field by field, then checked as a spec is."""
    f = Fields(doc)

    def env(v: Any) -> dict[str, str]:
        if not isinstance(v, dict):
            raise Malformed("expected an object of strings")
        return {string(k): string(x) for k, x in v.items()}

    spec = UnitSpec(
        name=f.text("name"), command=f.texts("command"), env=f.read("env", env),
        gpus=f.read("gpus", lambda v: Fields({"g": v}).gpus("g"), optional=True),
        port=f.opt_integer("port", 1, 65535), ready_host=f.text("ready_host"), engine=f.opt_text("engine"),
        ready_url=f.opt_text("ready_url"), ready_log=f.opt_text("ready_log"), smoke=f.flag("smoke"),
        model=f.opt_text("model"), start_timeout=f.seconds("start_timeout"), grace=f.seconds("grace"),
        stop_timeout=f.seconds("stop_timeout"), cwd=f.opt_text("cwd"),
        containment=f.choice("containment", Containment),
        prefetch=f.read("prefetch", lambda v: Fields({"p": v}).texts("p"), optional=True),
        front=f.opt_text("front"), front_hold=f.seconds("front_hold"))
    try:
        return spec.validate()
    except UsageError as exc:
        raise Malformed(str(exc)) from None


def resolved(config: str | os.PathLike[str] | None = None) -> ConfigResult:
    """The unit file (``config``, else found as ``up`` finds it) with every unit resolved: a
    :class:`~gpuslate.errors.UsageError` (its ``FILE:LINE``) for the first thing wrong in it."""
    path = find_config(config)
    if path is None:
        raise UsageError(f"no unit file: no {CONFIG_NAME} here or in a folder above, no {CONFIG_VAR}",
                         hint="write one (docs/units.md, gpuslate.toml), or name it with --config PATH")
    names = list(load_config(path))  # the whole file checked, with FILE:LINE
    units = []
    for name in names:
        try:
            units.append(resolve(name, config=path))
        except UsageError as exc:  # what only the whole unit can tell (no command, a cwd that is not there)
            raise UsageError(f"{path}: {exc}", hint=exc.hint) from None
    return ConfigResult(str(path), units)


def toml_text(result: ConfigResult) -> str:
    """The resolved units as a unit file: every key written, defaults included (``prefetch`` and
    ``front`` only when set: unset means "detect" and "none"); it reads back as the same units."""
    out = [f"# {result.path}: {len(result.units)} unit{'s' if len(result.units) != 1 else ''}, resolved "
           "(every key; defaults filled in, paths absolute)"]
    for spec in result.units:
        doc = spec.to_json()
        out += ["", f"[units.{_key(spec.name)}]"]
        for key, value in doc.items():
            if key == "name" or (value is None and key != "gpus"):
                continue
            if key == "gpus":
                value = "all" if value is None else format_gpu_list(value)
            out.append(f"{key} = {_value(value)}")
    return "\n".join(out) + "\n"


def _key(name: str) -> str:
    return name if all(c.isalnum() or c in "_-" for c in name) and name.isascii() else json.dumps(name)


def _value(v: Any) -> str:
    """A TOML value: JSON's strings, numbers and arrays are TOML's too; a table is written inline."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + " }" if v else "{}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):  # JSON's escapes are TOML's; TOML wants DEL escaped too
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")
    return str(v)
