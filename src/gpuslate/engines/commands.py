"""A deployment's command in its engine's terms: recognise it, read it, write the recommendation.

Pure: no process, no file of its own (a file a command names is read through
the caller's ``read_file``). The engine-specific rules are the engine modules';
this module only dispatches through :mod:`.registry`:

* :func:`detect`: the engine a command runs (an ``env NAME=VALUE`` prefix and
  ``python -m MODULE`` forms included) and where its own arguments start;
* :func:`read_command`: the speculative settings it runs with (the simulator's
  ``--emulate ENGINE -- ARGS`` read as that engine's);
* :func:`plan_apply`: the files and the whole command line that run "speculate
  while the batch is at most T" on it, or why nothing is written (a blocker, a
  version known to lack the knob, what cannot be read): a file that silently
  does nothing is worse than none;
* :func:`plan_patched`: the same through a patched engine's own flag
  (``--speculative-disable-batch-threshold T``), which no upstream release has;
* :func:`plan_as_measured`: always off / never disable, a measured deployment as it ran;
* :func:`read_park`: what a deployment's command makes possible for its engine's park (the levels
  its flags allow, what it lacks, the known hazards its settings meet).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from .args import OptionTable, Style, scan
from .base import (
    COMMAND_FILE,
    ApplyPlan,
    ApplyStatus,
    Engine,
    HazardEffect,
    ParkReading,
    ReadFile,
    SpecCommand,
    VersionStatus,
    ambiguity_blockers,
)
from .registry import BACKENDS

#: interpreter options that take a value (``python -X dev -m ...``)
_PY_VALUED = ("-X", "-W", "-Q")


def engine(name: str | None) -> Engine | None:
    return BACKENDS.get(name) if name is not None else None


def names() -> tuple[str, ...]:
    return tuple(BACKENDS)


def by_reported(name: object) -> Engine | None:
    """The engine a running server was recorded as (a point's ``engine.engine``)."""
    return next((e for e in BACKENDS.values() if e.reported == name), None)


def engine_files() -> tuple[str, ...]:
    """Every file a report may write for an engine (the command line's included)."""
    return (*dict.fromkeys(f for e in BACKENDS.values() for f in e.files), COMMAND_FILE)


def _program_start(argv: Sequence[str]) -> int:
    """Skip an ``env [-i] [NAME=VALUE ...]`` prefix: the index of the program itself."""
    i = 0
    if argv and Path(argv[0]).name == "env":
        i = 1
        while i < len(argv) and (argv[i] in ("-i", "--ignore-environment") or
                                 re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", argv[i]) is not None):
            i += 1
    return i


def detect(argv: Sequence[str]) -> tuple[Engine | None, int]:
    """The engine a command runs and the index where its own arguments start."""
    i = _program_start(argv)
    if i >= len(argv):
        return None, len(argv)
    prog, rest = Path(argv[i]).name, list(argv[i + 1:])
    module, after, at = None, [], 0
    if re.fullmatch(r"python[0-9.]*", prog):
        j = i + 1
        while j < len(argv) and argv[j].startswith("-") and argv[j] != "-m":
            j += 2 if argv[j] in _PY_VALUED else 1
        if j + 1 < len(argv) and argv[j] == "-m":
            module, after, at = argv[j + 1], list(argv[j + 2:]), j + 2
    for e in BACKENDS.values():
        forms = [(p, w, rest, i + 1) for p, w in e.launch.programs if p == prog]
        forms += [(m, w, after, at) for m, w in e.launch.modules if module is not None and m == module]
        for _, words, args, base in forms:
            if args[:len(words)] == list(words) and not (not words and args[:1] and args[0] in e.launch.other_commands):
                return e, base + len(words)
    return None, i + 1


def read_command(argv: Sequence[str], facts: Mapping[str, Any] | None = None,
                 read_file: ReadFile | None = None) -> SpecCommand:
    """The speculative settings of a deployment's command. ``facts``: what the running server
    reported (used where the command names nothing, and to find blockers set by other means);
    ``read_file``: reads a file the command names (TensorRT-LLM's options file)."""
    argv = tuple(argv)
    e, start = detect(argv)
    if e is None:
        forms = ", ".join(" ".join(x.launch.argv()) + " ..." for x in BACKENDS.values())
        return SpecCommand(argv, None, missing=(f"the command is none gpuslate reads ({forms}): write the "
                                                "configuration by hand",))
    inner = e.delegate(argv, start)
    if inner is not None and inner[0] in BACKENDS and inner[0] != e.name and inner[1] <= len(argv):
        return BACKENDS[inner[0]].read(argv, inner[1], dict(facts or {}), read_file)
    return e.read(argv, start, dict(facts or {}), read_file)


def no_switch_sentence(e: Engine | None, version: str | None) -> str:
    name = e.title if e is not None else "this engine"
    return (f"{name} {version or ''}".rstrip() + " has no upstream switch to turn speculation off above a batch "
            "size. The ways left: a patched engine with a flag of the seed's kind "
            "(--speculative-disable-batch-threshold N; name it as threshold_flag on the speculative unit), or "
            "routing: send requests to the speculative deployment while fewer than T+1 are in flight, to a baseline "
            "deployment above")


def rewritten(cmd: SpecCommand, new: Sequence[str]) -> tuple[str, ...]:
    """``cmd``'s argv with its ``drop`` spans left out and ``new`` put where the first of them was
    (``insert_at``), or at the end."""
    out: list[str] = []
    for i, a in enumerate(cmd.argv):
        if i == cmd.insert_at:
            out += new
        if not any(lo <= i < hi for lo, hi in cmd.drop):
            out.append(a)
    if cmd.insert_at is None or cmd.insert_at >= len(cmd.argv):
        out += new
    return tuple(out)


def plan_apply(cmd: SpecCommand, threshold: int, *, top: int, out_dir: str | Path,
               version: str | None) -> ApplyPlan:
    """The files and the command line that run "speculate while the batch is at most ``threshold``"
    on ``cmd``'s engine (pure: nothing is written here). ``top``: the largest level measured;
    ``version``: the engine's, as the running server reported it."""
    e = engine(cmd.engine)
    vstat, versions = e.version_status(version) if e is not None else (VersionStatus.UNKNOWN, "unknown engine")
    base = ApplyPlan(ApplyStatus.READY, cmd.engine, versions=versions, blockers=cmd.blockers, missing=cmd.missing,
                     notes=cmd.notes, version=version, version_status=vstat)
    if e is None or not cmd.readable:
        return replace(base, status=ApplyStatus.UNREADABLE)
    if vstat is VersionStatus.NO_KNOB:
        return replace(base, status=ApplyStatus.BLOCKED, notes=(*cmd.notes, no_switch_sentence(e, version)))
    if cmd.blockers:
        return replace(base, status=ApplyStatus.BLOCKED)
    w = e.write(cmd, threshold, top=top, out_dir=str(out_dir))
    command = rewritten(cmd, w.args)
    return replace(base, command=command, files={**w.files, COMMAND_FILE: shlex.join(command) + "\n"},
                   measured=w.measured, does=w.does, unproven=w.unproven, notes=(*cmd.notes, *w.notes))


def plan_patched(argv: Sequence[str], flag: str, threshold: int, *, version: str | None) -> ApplyPlan:
    """The speculative deployment's command with its patched engine's own ``flag`` set to
    ``threshold`` (a value already there replaced, where the engine's parser finds it), as the seed's
    engineer patched SGLang with ``--speculative-disable-batch-threshold N``."""
    argv = tuple(argv)
    e, start = detect(argv)
    if e is not None and (inner := e.delegate(argv, start)) is not None and inner[0] in BACKENDS:
        e, start = BACKENDS[inner[0]], inner[1]
    table = e.options.with_valued(flag) if e is not None else OptionTable(Style.EXACT, valued=((flag,),))
    s = scan(argv, start, table)
    title = e.title if e is not None else "the engine"
    blockers = ambiguity_blockers(s, title, "the engine's own parser")
    found = [o for o in s.found if o.name == flag]
    new = (found[-1].written if found else flag, str(threshold))
    cmd = SpecCommand(argv, e.name if e is not None else None, drop=tuple(o.span for o in found),
                      insert_at=found[0].span[0] if found else s.end, start=start)
    patch = f"a {title} patched to take {flag} (the speculative deployment's own build; no upstream release has it)"
    plan = ApplyPlan(ApplyStatus.READY, cmd.engine, versions=patch, version=version,
                     version_status=VersionStatus.UNKNOWN, patched_flag=flag, blockers=blockers,
                     notes=(f"relies on a patch of {title}, not on an upstream knob: the recommendation is the "
                            f"patched engine's own {flag}",))
    if blockers:
        return replace(plan, status=ApplyStatus.BLOCKED)
    command = rewritten(cmd, new)
    return replace(plan, command=command, files={COMMAND_FILE: shlex.join(command) + "\n"},
                   measured=f"the speculative deployment ({title}) as it ran, against the baseline",
                   does=(f"the patched engine's own {new[0]} {threshold}: speculation while the batch is at most "
                         f"{threshold}, not above"),
                   unproven=(f"what the patch does around the switch is the patch's (the recommendation's own run "
                             f"measures it at {threshold}, {threshold + 1} and the level above)",))


def plan_as_measured(decision: str, argv: Sequence[str], engine_name: str | None, version: str | None) -> ApplyPlan:
    """Always off or never disable: the recommendation is a deployment that was measured, as it is."""
    what = "the baseline deployment" if decision == "always_off" else "the speculative deployment"
    e = engine(engine_name)
    vstat, versions = e.version_status(version) if e is not None else (VersionStatus.UNKNOWN, "unknown engine")
    return ApplyPlan(ApplyStatus.AS_MEASURED, engine_name, tuple(argv), {COMMAND_FILE: shlex.join(argv) + "\n"},
                     measured=f"{what}, as it ran", does=f"nothing to switch: run {what} as it is",
                     versions=versions, version=version, version_status=vstat)


def reference_forms(k: int, threshold: int | None, top: int) -> dict[str, Any]:
    """The threshold in every engine's form with K (``threshold`` 0: always off; None: never disable)."""
    return dict(e.reference(k, threshold, top) for e in BACKENDS.values())


def engine_of(argv: Sequence[str]) -> tuple[Engine | None, int]:
    """The engine whose arguments a command carries, and where they start: the simulator's
    ``--emulate ENGINE -- ARGS`` is that engine's."""
    argv = tuple(argv)
    e, start = detect(argv)
    if e is not None and (inner := e.delegate(argv, start)) is not None and inner[0] in BACKENDS \
            and inner[0] != e.name and inner[1] <= len(argv):
        return BACKENDS[inner[0]], inner[1]
    return e, start


def read_park(argv: Sequence[str], env: Mapping[str, str]) -> ParkReading | None:
    """What ``argv`` (run with environment ``env``) makes possible for its engine's park; None when
    its engine cannot park (or is none gpuslate reads)."""
    e, start = engine_of(argv)
    return park_reading(e, tuple(argv), start, env) if e is not None else None


def park_reading(e: Engine, argv: tuple[str, ...], start: int, env: Mapping[str, str]) -> ParkReading | None:
    """:func:`read_park` for an engine's arguments starting at ``start``: the levels its flags allow,
    the best first, each with the first known hazard it meets (a generation that faults after the
    resume, a park that frees nothing), by the engine's own facts (``Engine.park``)."""
    park = e.park
    if park is None:
        return None
    s = scan(argv, start, e.options)
    flags = tuple(dict.fromkeys(o.name for o in s.found))
    cmd = e.read(argv, start, {}, None)
    method = cmd.method.lower() if cmd.method else None
    levels = tuple(
        (lv, park.hazard(lv.level, HazardEffect.FAULTS_AFTER_RESUME, method=method, flags=flags, env=env)
         or park.hazard(lv.level, HazardEffect.FREES_NOTHING, method=method, flags=flags, env=env))
        for lv in park.levels if lv.usable(flags))
    model_path = s.value(park.model_option) if park.model_option is not None else None
    return ParkReading(e.name, park, park.missing(flags, env), levels, method, flags, model_path)
