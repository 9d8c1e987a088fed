"""The engine Protocol and the typed records every engine module fills in.

An *engine* is a model server gpuslate knows by its own rules: how its command
line is recognised and read (its parser's rules, abbreviations included), the
settings under which it ignores the speculation knob (blockers), the versions
that have each knob, how a running server says what it is, how a recommendation
is written in its own form (files and the whole command line), how units check
that it serves, and how it parks and resumes where it can. One module per
engine implements :class:`Engine`; :mod:`.registry` holds them, one line each.

Nothing here starts a process, opens a socket or reads a file by itself: a
file an engine's command names is read through the ``read_file`` callable its
caller passes (bounded by the caller).
"""

from __future__ import annotations

import enum
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .args import OptionTable, Scan

#: reads a file a command names (its text); raises OSError or ValueError when it cannot
ReadFile = Callable[[str], str]
COMMAND_FILE = "recommended-command.txt"


class ApplyStatus(str, enum.Enum):
    """What ``apply`` could do with a recommendation."""

    READY = "ready"  # the files and the command line are written
    AS_MEASURED = "as_measured"  # always off / never disable: a measured deployment's command, unchanged
    BLOCKED = "blocked"  # a setting, or the engine's version, keeps the engine from applying it: nothing written
    UNREADABLE = "unreadable"  # the command cannot be read (what is missing is named): nothing written
    NOT_RECOMMENDED = "not_recommended"  # no threshold recommended: nothing written
    WITHDRAWN = "withdrawn"  # its own run collapsed at the switch: nothing written (the figures are in the report)


class VersionStatus(str, enum.Enum):
    HAS_KNOB = "has_knob"
    NO_KNOB = "no_knob"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Blocker:
    """A setting of the command under which the engine ignores or disables the knob, or refuses
    the command (an ambiguous abbreviation)."""

    setting: str
    why: str
    source: str

    def to_json(self) -> dict[str, str]:
        return {"setting": self.setting, "why": self.why, "source": self.source}


@dataclass(frozen=True)
class Knob:
    """An upstream switch that turns speculation off above a batch size, and where it is known from.
    ``first_release`` None: the first release that has it is not in the sources read."""

    name: str
    introduced: str  # the change that brought it (a PR), with its date
    first_release: tuple[int, ...] | None
    source: str


@dataclass(frozen=True)
class SpecCommand:
    """The speculative settings read from a deployment's command (see ``read_command``)."""

    argv: tuple[str, ...]
    engine: str | None  # a registry name, None: no engine gpuslate reads
    k: int | None = None  # the measured draft length: vLLM num_speculative_tokens, SGLang steps, TRT-LLM max_draft_len
    method: str | None = None  # vLLM method, SGLang speculative_algorithm, TRT-LLM decoding_type
    draft: str | None = None
    topk: int | None = None
    config: dict[str, Any] | None = None  # vLLM --speculative-config; TRT-LLM the options file's speculative_config
    document: dict[str, Any] | None = None  # TRT-LLM: the whole options file
    missing: tuple[str, ...] = ()  # why nothing can be written from it
    blockers: tuple[Blocker, ...] = ()
    notes: tuple[str, ...] = ()
    drop: tuple[tuple[int, int], ...] = ()  # argv spans replaced when the recommendation is written
    insert_at: int | None = None  # where the new arguments go (None: at the end)
    start: int = 0  # where the engine's own arguments start in argv
    extras: tuple[tuple[str, str], ...] = ()  # the engine's own facts of the command (TRT-LLM: the flag's spelling)

    @property
    def readable(self) -> bool:
        return self.engine is not None and not self.missing

    def to_json(self) -> dict[str, Any]:
        return {"engine": self.engine, "k": self.k, "method": self.method, "draft": self.draft, "topk": self.topk,
                "speculative_config": self.config, "missing": list(self.missing),
                "blockers": [b.to_json() for b in self.blockers], "notes": list(self.notes)}


@dataclass(frozen=True)
class Written:
    """What an engine writes for "speculate while the batch is at most T": the files (name -> text,
    next to the report), the arguments that replace the command's ``drop`` spans, and the report's
    sentences."""

    files: dict[str, str]
    args: tuple[str, ...]
    measured: str
    does: str
    unproven: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ApplyPlan:
    """The recommendation as its engine takes it, and what the report says about it."""

    status: ApplyStatus
    engine: str | None
    command: tuple[str, ...] = ()  # the whole command line that runs the recommendation
    files: dict[str, str] = field(default_factory=dict)  # name -> text, written next to report.md
    measured: str = ""  # what was measured
    does: str = ""  # what the files do
    versions: str = ""  # on which engine versions
    unproven: tuple[str, ...] = ()
    blockers: tuple[Blocker, ...] = ()
    missing: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    version: str | None = None
    version_status: VersionStatus = VersionStatus.UNKNOWN
    patched_flag: str | None = None  # the recommendation relies on a patched engine's own flag

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status.value, "engine": self.engine, "version": self.version,
                "version_status": self.version_status.value, "command": list(self.command),
                "command_line": shlex.join(self.command) if self.command else None,
                "files": dict(self.files), "measured": self.measured, "does": self.does,
                "versions": self.versions, "unproven": list(self.unproven),
                "blockers": [b.to_json() for b in self.blockers], "missing": list(self.missing),
                "notes": list(self.notes), "patched_flag": self.patched_flag}


@dataclass(frozen=True)
class Launch:
    """How the engine's server is started: programs on ``PATH`` (``vllm serve``: the program and the
    words after it) and Python modules (``python -m sglang.launch_server``). ``standin`` is the form a
    stand-in takes (the demo's emulated engines): the first program, else the first module."""

    programs: tuple[tuple[str, tuple[str, ...]], ...] = ()
    modules: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: words after the program that start another of its commands (``trtllm-serve disaggregated``)
    other_commands: tuple[str, ...] = ()

    def argv(self) -> tuple[str, ...]:
        """The words a command line of this engine starts with (after the interpreter for a module)."""
        if self.programs:
            prog, words = self.programs[0]
            return (prog, *words)
        module, words = self.modules[0]
        return ("-m", module, *words)


@dataclass(frozen=True)
class Example:
    """A baseline and an EAGLE-3 deployment of the engine, in its own form (the demo's story told
    in each engine's terms): the words that start the command (a program and its words, or ``-m``
    and a module), the arguments after them, the files they name (written into the folder given)
    and the version an emulated engine reports."""

    form: tuple[str, ...]
    baseline: tuple[str, ...]
    speculative: tuple[str, ...]
    files: dict[str, str]
    version: str


@dataclass(frozen=True)
class HttpCall:
    method: str
    path: str  # ``{level}`` in it is the level
    body: Mapping[str, Any] | None = None  # ``"{model_path}"`` in a value is the model's path

    @property
    def route(self) -> str:
        """The path without its query (what a server routes on)."""
        return self.path.partition("?")[0]

    def filled(self, *, level: int, model_path: str | None) -> HttpCall:
        """This call for ``level`` and ``model_path``."""
        body = None if self.body is None else {
            k: (model_path if v == "{model_path}" else v) for k, v in self.body.items()}
        return HttpCall(self.method, self.path.replace("{level}", str(level)), body)


class ParkStyle(str, enum.Enum):
    """How an engine parks, as a whole (what the simulator plays, and what a resume after an
    interruption may safely call)."""

    #: the engine sleeps at a level: its scheduler paused from the sleep to the wake (requests that
    #: arrive wait), every call idempotent (a second sleep, a wake of an awake engine: 200, nothing done)
    SLEEP = "sleep"
    #: tagged memory is released and resumed; a release with a request running, or a resume of a tag
    #: that was not released, kills the server (an assertion, a KeyError in its scheduler)
    RELEASE = "release"

    def __str__(self) -> str:
        return self.value


class HazardEffect(str, enum.Enum):
    """What a known park failure does."""

    FREES_NOTHING = "frees_nothing"  # the park answers 200 and frees nothing
    FAULTS_AFTER_RESUME = "faults_after_resume"  # the first generation after the resume kills the engine

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class ParkHazard:
    """A known way the engine's park fails under some settings of its command (an upstream report):
    at ``levels`` (empty: every level), for speculative ``methods`` (lower case; empty: whatever the
    command runs), unless ``unless_flag`` is given, when ``env`` (a variable and a setting its value
    holds, lower case without spaces) is set so."""

    effect: HazardEffect
    why: str
    source: str
    levels: tuple[int, ...] = ()
    methods: tuple[str, ...] = ()
    unless_flag: str | None = None
    env: tuple[str, str] | None = None

    def applies(self, level: int, *, method: str | None, flags: Sequence[str], env: Mapping[str, str]) -> bool:
        if self.levels and level not in self.levels:
            return False
        if self.methods and (method or "").lower() not in self.methods:
            return False
        if self.unless_flag is not None and self.unless_flag in flags:
            return False
        if self.env is not None:
            name, setting = self.env
            return setting in env.get(name, "").replace(" ", "").lower()
        return True


@dataclass(frozen=True)
class ParkLevel:
    """One way of parking: what it frees, the calls that park and resume it, what resuming needs."""

    level: int
    frees: str
    park: tuple[HttpCall, ...]
    resume: tuple[HttpCall, ...]  # in order
    offloads: bool  # the weights are copied into host memory (what must fit there)
    resume_reloads_weights: bool  # the weights are gone: resuming loads them again (from disk)
    needs_flag: str | None = None  # a start flag this level needs besides Park.flag
    not_with: str | None = None  # a start flag under which the engine parks at another level instead

    def usable(self, flags: Sequence[str]) -> bool:
        return (self.needs_flag is None or self.needs_flag in flags) and \
            (self.not_with is None or self.not_with not in flags)


@dataclass(frozen=True)
class RunningCheck:
    """How a running server says how many requests it has (a drain waits until none): a GET whose
    answer is Prometheus text (the ``prometheus`` gauges summed) or JSON (the ``keys`` summed over
    the document, one object or a list of one per rank)."""

    call: HttpCall
    prometheus: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()


#: the most a parked process may keep on a GPU, at most (the CUDA context, what the engine keeps: its
#: CUDA graphs outside the pools): vLLM's docs say about 1 GB per GPU; #32714 saw 16 GB stay
PARK_RESIDUE_CAP = 4 * 1024**3
#: and at most this share of what it held before the park
PARK_RESIDUE_FRACTION = 0.10


@dataclass(frozen=True)
class Park:
    """How a running server gives its GPU memory back without exiting, and takes it again. Every
    fact is from the engine's sources (docs/units.md, "Park and resume")."""

    style: ParkStyle
    flag: str  # the command-line flag the server must have been started with
    env: Mapping[str, str]  # environment the server must have been started with (the routes exist only then)
    levels: tuple[ParkLevel, ...]  # the best first (``auto`` takes the first the command allows)
    tags: tuple[str, ...]  # the memory the engine parks, by its own names
    running: RunningCheck
    status: HttpCall | None = None  # asks whether it is parked
    reload_weights: HttpCall | None = None  # after a level whose weights are gone
    hazards: tuple[ParkHazard, ...] = ()
    model_option: str | None = None  # the option whose value a reload from disk reads
    residue_cap: int = PARK_RESIDUE_CAP
    residue_fraction: float = PARK_RESIDUE_FRACTION
    source: str = ""

    def missing(self, given: Sequence[str], env: Mapping[str, str]) -> tuple[str, ...]:
        """What a server started with options ``given`` (canonical names, as read) and ``env`` lacks
        to be parked: empty when nothing."""
        out = [] if self.flag in given else [f"started without {self.flag}"]
        out += [f"started without {k}={v}" for k, v in self.env.items() if env.get(k) != v]
        return tuple(out)

    def level(self, n: int) -> ParkLevel | None:
        return next((lv for lv in self.levels if lv.level == n), None)

    def calls(self) -> tuple[HttpCall, ...]:
        """Every call of every level, the status and the reload (the routes a server of this engine has)."""
        found = [c for lv in self.levels for c in (*lv.park, *lv.resume)]
        found += [c for c in (self.status, self.reload_weights, self.running.call) if c is not None]
        return tuple(found)

    def hazard(self, level: int, effect: HazardEffect, *, method: str | None, flags: Sequence[str],
               env: Mapping[str, str]) -> ParkHazard | None:
        """The first hazard of ``effect`` that a park at ``level`` meets under these settings."""
        return next((h for h in self.hazards if h.effect is effect
                     and h.applies(level, method=method, flags=flags, env=env)), None)


@dataclass(frozen=True)
class ParkReading:
    """What a deployment's own command makes possible for its engine's park: read by the engine's
    own rules (:func:`~gpuslate.engines.commands.read_park`). ``levels``: those the command allows,
    the best first, each with the hazard that rules it out (None: none)."""

    engine: str
    park: Park
    missing: tuple[str, ...]  # why the engine cannot park it at all (a start flag, its environment)
    levels: tuple[tuple[ParkLevel, ParkHazard | None], ...]
    method: str | None  # the speculative method the command runs (lower case), None: none
    flags: tuple[str, ...]  # the flags given (canonical names)
    model_path: str | None  # what a reload from disk reads

    def usable(self) -> list[ParkLevel]:
        """The levels a park may take, the best first (none when something is missing)."""
        if self.missing:
            return []
        return [lv for lv, h in self.levels if h is None]


@dataclass(frozen=True)
class Readiness:
    """Units' readiness for the engine: every path answers 200, in order."""

    paths: tuple[str, ...]
    what: str  # for --help and the docs


class Listening(str, enum.Enum):
    """When a server's port takes connections while it loads: what a client, a probe or a front
    sees before it serves."""

    AT_ONCE = "at_once"  # bound and listening before it loads, answering 503 until ready
    BOUND_REFUSING = "bound_refusing"  # bound before it loads (the port is taken), listening once it serves:
    # until then a connection is refused
    AFTER_LOAD = "after_load"  # bound and listening only once loaded (the port is free until then), then its
    # health routes answer 503 while it warms up

    def __str__(self) -> str:
        return self.value


class OnTerm(str, enum.Enum):
    """What a server does when its main process gets SIGTERM."""

    IMMEDIATE = "immediate"  # ends the requests in flight, closes its port, exits
    DRAIN_REFUSING = "drain_refusing"  # keeps its port: every route answers 503 (its health too), the requests
    # in flight finish, bounded; then it exits
    DRAIN_SERVING = "drain_serving"  # keeps serving, new requests too; its health routes answer 503; it exits
    # once no request runs, which it looks at every poll
    DRAIN_CLOSED = "drain_closed"  # closes its port at once, lets the requests in flight finish, exits

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, kw_only=True)
class Shutdown:
    """How a server stops on SIGTERM: ``on_term``; ``timeout_s`` bounds a drain (None: no bound of its
    own: the service manager's SIGKILL); ``poll_s``: the drain is looked at every ``poll_s`` from the
    server's start (None: at once); ``refusal``: the error its 503 says while it drains refusing."""

    on_term: OnTerm
    timeout_s: float | None = None
    poll_s: float | None = None
    refusal: str = ""

    @property
    def drains(self) -> bool:
        return self.on_term != OnTerm.IMMEDIATE


@dataclass(frozen=True, kw_only=True)
class Lifecycle:
    """How an engine's server starts and stops, as a client in front of it sees it: when its port
    takes connections (``listening``), how long its health routes answer 503 after that
    (``warmup_s``, then a generation of ``warmup_tokens``), what SIGTERM does (``shutdown``, unless
    its arguments choose another: the engine's ``emulate`` says), which routes answer 503 while it
    warms up or drains (``health_paths``), and how soon the death of one of its worker processes (a
    rank, an engine core) ends the whole server and its requests (``worker_watch_s``; None: not read
    in its sources). The simulator plays it (``sim serve --emulate``); every fact is from the
    engine's sources."""

    listening: Listening
    shutdown: Shutdown
    warmup_s: float = 0.0
    warmup_tokens: int = 0
    health_paths: tuple[str, ...] = ()
    worker_watch_s: float | None = None
    source: str = ""


@dataclass(frozen=True)
class Emulated:
    """What an engine's arguments set on gpuslate's simulated server (``sim serve --emulate``)."""

    port: int
    model: str
    host: str | None = None
    api_key: str | None = None
    max_running: int | None = None
    speculative: bool = False
    threshold: int | None = None  # speculate while the batch is at most this (None: at every batch size)
    info: dict[str, Any] = field(default_factory=dict)  # the engine's own facts the server reports
    warnings: tuple[str, ...] = ()  # the engine's log lines about what it ignored or disabled
    shutdown: Shutdown | None = None  # what SIGTERM does with these arguments (None: its lifecycle's)


@dataclass(frozen=True)
class Answers:
    """What a running server answered to the probes (path -> JSON document, None: no 200 answer)."""

    docs: Mapping[str, Any]
    owned_by: str | None  # ``owned_by`` of its first model on ``GET /v1/models``

    def doc(self, path: str) -> Any:
        return self.docs.get(path)


@dataclass(frozen=True)
class Counters:
    """Where an engine publishes its speculative-decoding counters."""

    info_path: str | None = None  # a JSON document with gpuslate's own counters (spec_tokens, ...)
    prometheus: tuple[str, str] | None = None  # (accepted tokens, drafts) counters of ``/metrics``


def fact_value(v: object) -> bool:
    """A fact worth keeping from a server's document: a scalar, a short string (bounded bytes)."""
    return v is None or isinstance(v, (bool, int, float)) or (isinstance(v, str) and len(v) <= 256)


def version_tuple(version: str | None) -> tuple[int, int] | None:
    """``(major, minor)`` of a version string (``v0.25.1``, ``0.5.11rc2``), None when it has none."""
    m = re.match(r"v?(\d+)\.(\d+)", version or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def ambiguity_blockers(s: Scan, title: str, source: str) -> tuple[Blocker, ...]:
    """What makes the engine's own parser refuse the command, named: an ambiguous abbreviation
    (argparse), an abbreviation at all (click)."""
    out = [Blocker(written, f"ambiguous option: {title}'s argparse takes unambiguous prefixes of its options, and "
                   f"{written} could match {', '.join(matches)}: it refuses the command", source)
           for written, matches in s.ambiguous]
    out += [Blocker(written, f"{title}'s parser takes whole option names only: it refuses {written} (no such "
                    f"option; did you mean {', '.join(matches)}?)", source)
            for written, matches in s.refused]
    return tuple(out)


def abbreviation_notes(s: Scan) -> tuple[str, ...]:
    return tuple(f"{o.written} is read as {o.name}, as the engine's argparse takes an unambiguous prefix"
                 for o in s.abbreviations())


def threshold_of(k_of: Callable[[int], int], max_batch: int) -> int | None:
    """The simulator's threshold for a per-batch-size draft length: speculate while the batch is at
    most T, not above (None: at every batch size). ValueError for any other shape."""
    on = [k_of(b) > 0 for b in range(1, max_batch + 1)]
    last_on = max((b for b, s in enumerate(on, 1) if s), default=0)
    if not all(on[:last_on]):
        raise ValueError("the simulator models speculation up to one batch size and not above; this schedule "
                         "turns it off and on again")
    return None if last_on == max_batch else last_on


class Engine(Protocol):
    """One engine, as gpuslate knows it. See the module docstring; the modules in this package
    are the implementations, :mod:`.registry` the list."""

    @property
    def name(self) -> str:
        """The registry key: the unit spec's engine, --engine, --emulate, the points' engine."""
        ...

    @property
    def title(self) -> str:
        """As people write it ("SGLang")"""
        ...

    @property
    def owned_by(self) -> str | None:
        """What its GET /v1/models says in owned_by."""
        ...

    @property
    def launch(self) -> Launch:
        """How its server is started (programs and Python modules)."""
        ...

    @property
    def options(self) -> OptionTable:
        """The option names gpuslate reads, by the engine's own parser rules."""
        ...

    @property
    def readiness(self) -> Readiness:
        """Units' readiness check for it."""
        ...

    @property
    def lifecycle(self) -> Lifecycle:
        """How its server starts and stops (its port while loading, SIGTERM, a worker's death)."""
        ...

    @property
    def knobs(self) -> tuple[Knob, ...]:
        """The upstream switches it has, oldest first."""
        ...

    @property
    def park(self) -> Park | None:
        """None: it cannot park (or how is not in the sources read)."""
        ...

    @property
    def counters(self) -> Counters:
        """Where it publishes its speculative-decoding counters."""
        ...

    @property
    def continuous_usage(self) -> bool:
        """Takes stream_options.continuous_usage_stats (usage on every chunk)."""
        ...

    @property
    def probes(self) -> tuple[str, ...]:
        """GET paths that tell what a running server is (besides /v1/models)."""
        ...

    @property
    def files(self) -> tuple[str, ...]:
        """Every file name its recommendation may write (besides COMMAND_FILE)."""
        ...

    @property
    def reported(self) -> str:
        """The engine name its running server is recorded under (the points' engine.engine)."""
        ...

    @property
    def plays_others(self) -> bool:
        """Its servers may answer as another engine does (the simulator's --emulate): asked first."""
        ...

    @property
    def facts(self) -> tuple[str, ...]:
        """The keys of its info document worth recording with every point."""
        ...

    def delegate(self, argv: tuple[str, ...], start: int) -> tuple[str, int] | None:
        """Another engine whose arguments this command carries, and where they start (the simulator's
        ``--emulate``); None for an engine's own command."""
        ...

    def read(self, argv: tuple[str, ...], start: int, facts: Mapping[str, Any],
             read_file: ReadFile | None) -> SpecCommand:
        """The speculative settings of a command whose own arguments start at ``start``;
        ``facts``: what the running server reported."""
        ...

    def version_status(self, version: str | None) -> tuple[VersionStatus, str]:
        """Whether this version has the knob, and the sentence the report says about it."""
        ...

    def write(self, cmd: SpecCommand, threshold: int, *, top: int, out_dir: str) -> Written:
        """The files and arguments that make ``cmd`` speculate while the batch is at most ``threshold``
        (``cmd`` is readable and unblocked; ``top``: the largest level measured)."""
        ...

    def reference(self, k: int, threshold: int | None, top: int) -> tuple[str, Any]:
        """The threshold in this engine's form with K, for the summary's reference forms (key, value);
        ``threshold`` 0: always off, None: never disable."""
        ...

    def identify(self, answers: Answers) -> dict[str, Any] | None:
        """The facts of a running server if it is this engine (engine, version, its settings)."""
        ...

    def emulate(self, argv: Sequence[str], *, version: str | None, max_batch: int,
                read_file: ReadFile) -> Emulated:
        """The simulated server's settings from this engine's arguments (after the program), by the
        engine's rules; ValueError: the engine (or the simulator) refuses them."""
        ...

    def not_taken(self, facts: Mapping[str, Any]) -> str | None:
        """What the running server reported that shows it did not take the written configuration
        (a fallback to static settings), as a sentence; None when nothing does."""
        ...

    def example(self, *, model: str, draft: str, port: int, gpus: int, steps: int, folder: str) -> Example | None:
        """A baseline and a speculative (EAGLE-3, ``steps`` draft tokens) deployment in this engine's
        form; None: the engine is not emulated (the simulator itself)."""
        ...
