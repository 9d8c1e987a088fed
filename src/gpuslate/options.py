"""What each verb takes: its input and options as records whose fields carry their command line.

Every option of a verb is written here once, as a typed field of a :class:`~gpuslate._record.Record`
(its flag, how its text is parsed and written back, its help and its default):

    class WaitOptions(Record):
        max_used: int | None = option("--max-used", parse=parse_size, ...)
        timeout: float = option("--timeout", parse=seconds, show=seconds_text, default=60.0, ...)

The library takes them (``host.wait(gpus, WaitOptions(timeout=5))``), ``gpuslate wait`` builds its
argparse options from them and reads them back from the parsed command line, and another host gets
them as the words they print as (:mod:`gpuslate.commandline`): one declaration, three uses, and a
test that walks every field through all three (tests/test_options.py). Each verb's whole command
line is a record too (``ClearLine``: its selection, its options and what only the command has,
``--yes``), named by its declaration in :mod:`gpuslate.verbs`.

Why one module, apart from the code of each verb: ``clearing/``, ``units/`` and ``host/`` take these
records, and so do ``--help``, shell completion and the remote command line, which must not import
those packages (``gpuslate status`` never loads ``units/``). So this module imports only the
parsers and the record idiom; what a field needs from a heavy module (a unit name's type, the
engines' names) it imports when it is used.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from enum import Enum
from typing import Any

from ._parse import (
    ALL_GPUS,
    check_seconds,
    check_size,
    format_front,
    format_gpu_list,
    parse_front,
    parse_gpu_selection,
    parse_int,
    parse_seconds,
    parse_size,
    size_text,
)
from ._record import Consent, Record, alias, field, flag, group, option, options, positional, rest
from .errors import UsageError
from .unitname import UnitName

# -- how values are read and written (UsageError for bad text; each show is read back by its parse) --


def seconds(text: str) -> float:
    """A duration, at least 0 and finite (at most ``MAX_SECONDS``): seconds (``90``) or with units
    (``90s``, ``1m30s``, ``500ms``): :func:`~gpuslate._parse.parse_seconds`."""
    return parse_seconds(text)


def positive_seconds(text: str) -> float:
    """A duration, more than 0 and finite."""
    return parse_seconds(text, allow_zero=False)


def seconds_text(value: float) -> str:
    return repr(float(value))  # the shortest text that reads back as the same float


def gpu_selection(text: str) -> tuple[int, ...] | None:
    """``--gpus`` of the verbs that act on GPUs: a GPU list, or ``all`` (docker's spelling): None,
    every GPU, as when the option is not given."""
    try:
        found = parse_gpu_selection(text)
    except UsageError as exc:
        raise UsageError(str(exc) + ", or all") from None
    return None if isinstance(found, str) else tuple(found)


def gpus_text(gpus: Sequence[int] | None) -> str:
    """A GPU list as ``--gpus`` reads it (None, every GPU, is the option not given: never written)."""
    return format_gpu_list(list(gpus or ()))


def unit_gpus(text: str) -> list[int] | str:
    """``up --gpus``: a GPU list, or ``all`` (every GPU: its environment's CUDA_VISIBLE_DEVICES left
    as it is), which is not the same as the option not given (the unit file's)."""
    try:
        return parse_gpu_selection(text)
    except UsageError as exc:
        raise UsageError(str(exc) + ", or all") from None


def unit_gpus_text(gpus: list[int] | str) -> str:
    return ALL_GPUS if isinstance(gpus, str) else format_gpu_list(list(gpus))


def pid(text: str) -> int:
    return parse_int(text, low=1, high=2**31 - 1)


def port(text: str) -> int:
    return parse_int(text, low=1, high=65535)


def text(value: str) -> str:
    """Any text, as given (a user's name, a regular expression, a path)."""
    return value


def unit_name(value: str) -> str:
    """A unit's name, checked (:class:`~gpuslate.unitname.UnitName`): a bad one is exit 2 before anything."""
    return UnitName(value)


def front_address(value: str) -> str:
    """``up --front``: ``PORT`` (on 127.0.0.1) or ``HOST:PORT``, written back as ``HOST:PORT``."""
    host, port = parse_front(value)
    return format_front(host, port)


def env_item(value: str) -> str:
    """``KEY=VALUE`` of ``up --env``."""
    key, eq, _ = value.partition("=")
    if not eq or not key:
        raise UsageError(f"invalid --env {value!r}: expected KEY=VALUE")
    return value


def limit(value: str) -> int:
    """``audit --limit``: a whole number, at least 0 (0: every entry)."""
    try:
        v = int(value)
    except ValueError:
        raise UsageError(f"invalid number {value!r}") from None
    if v < 0:
        raise UsageError(f"invalid value {value!r}: must be a whole number of at least 0")
    return v


def tail(value: str) -> int:
    return parse_int(value, low=0, high=10**9)


def since(value: str) -> float:
    """``logs --since``: the epoch time it names, now (a duration back from now, or a time)."""
    from ._time import parse_since  # lazy: startup (only logs --since reads a time)

    try:
        return parse_since(value, time.time())
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def since_text(value: float) -> str:
    """An epoch time as Unix seconds, every digit it has (the same moment on either clock)."""
    if not value >= 0:
        raise UsageError(f"a remote logs takes since as a time since 1970 (Unix seconds), not {value!r}")
    from decimal import Decimal  # lazy: startup (only a remote logs --since writes one)

    return format(Decimal(repr(float(value))), "f")


class Containment(str, Enum):
    """How a unit is fenced in (``up --containment``, a unit file's ``containment``): ``auto`` picks
    the first the host allows, in this order; a unit's record names the one it got."""

    AUTO = "auto"
    CGROUP = "cgroup"  # a cgroup v2 of its own, delegated to the user
    SCOPE = "scope"  # a systemd transient scope (systemd-run --user --scope)
    SESSION = "session"  # its own session and process group only

    def __str__(self) -> str:  # its value, as the spec and the record write it (not "Containment.CGROUP")
        return self.value


def containment(value: str) -> Containment:
    """``--containment``: one of :class:`Containment`'s values (another is refused by argparse's choices,
    with the list; a library caller's, by the enum)."""
    return Containment(value) if value in Containment._value2member_map_ else value  # type: ignore[return-value]


class ParkWay(str, Enum):
    """How a unit parks (a unit file's ``park``, ``up --park-method``, ``park --method``): its engine's
    own park with the weights kept in host memory (``level1``: vLLM's sleep level 1, SGLang's release
    with ``--enable-weights-cpu-backup``) or dropped and loaded again from disk on resume (``level2``:
    vLLM's sleep level 2 and ``reload_weights``, SGLang's release and ``update_weights_from_disk``);
    the driver's checkpoint (``checkpoint``: every byte into host memory, any one-process CUDA
    server); ``none`` (never parked: ``swap --park`` stops and starts it); ``auto``: the first of
    level1, level2, checkpoint that the unit's own command and processes make possible."""

    AUTO = "auto"
    LEVEL1 = "level1"
    LEVEL2 = "level2"
    CHECKPOINT = "checkpoint"
    NONE = "none"

    def __str__(self) -> str:
        return self.value


def park_way(value: str) -> ParkWay:
    """``--method``/``--park-method``: one of :class:`ParkWay`'s values (another is refused by argparse's
    choices; a library caller's, by the enum)."""
    return ParkWay(value) if value in ParkWay._value2member_map_ else value  # type: ignore[return-value]


PARK_WAYS = tuple(w.value for w in ParkWay)
MAX_USED_HELP = "most memory a free GPU may show (default 64MiB; 1GiB on drivers without NVML's v2 memory API)"
CONFIG_HELP = "unit file (default: $GPUSLATE_CONFIG, else gpuslate.toml here or in a folder above)"
NAMELESS_CONFIG_HELP = ("with no NAME: the unit file (default: $GPUSLATE_CONFIG, else gpuslate.toml here or "
                        "above)")


# -- status, clear, wait -------------------------------------------------------------------------


class StatusLine(Record):
    """``gpuslate status``: the GPUs to show, and ``--watch`` (the command's own)."""

    gpus: tuple[int, ...] | None = option(
        "--gpus", parse=gpu_selection, show=gpus_text, default=None, metavar="LIST",
        help="only these GPUs, e.g. 0,2-3 (default: all)")
    watch: float | None = option(
        "--watch", parse=positive_seconds, show=seconds_text, default=None, const=1.0, metavar="DURATION",
        help="refresh every DURATION (default 1s) until Ctrl-C; with --json, one document per line",
        why_here="status --watch does not work with --host: run it on the host (ssh -t HOST gpuslate ...)")
    compact: bool = flag(
        "--compact", help="one line per GPU: a memory bar, used/total, utilization, temperature and its holders "
        "(PID, user, memory), as gpustat shows them (--json: the same document)")


class Selection(Record):
    """What ``clear`` acts on. ``gpus`` None: every GPU."""

    gpus: tuple[int, ...] | None = option(
        "--gpus", parse=gpu_selection, show=gpus_text, default=None, metavar="LIST",
        help="GPUs to clear, e.g. 0,2-3 or all (default: all)")
    pids: tuple[int, ...] = options(
        "--pid", parse=pid, metavar="PID",
        help="only the jobs of the GPU holders that are PID or its descendants (repeatable)")
    user: str | None = option("--user", parse=text, default=None, metavar="NAME", help="only this user's processes")
    match: str | None = option(
        "--match", parse=text, default=None, metavar="REGEX",
        help="only the jobs of holders whose command line or title matches (their jobs come along)")
    holders_only: bool = flag(
        "--holders-only", help="only the selected holders and their descendants, not the rest of their jobs")
    all_users: bool = flag("--all-users", help="allow other users' processes as targets (needed even as root)")
    include_handles: bool = flag(
        "--include-handles", help="also terminate processes that only hold device handles (monitors, daemons)")

    @property
    def narrows(self) -> bool:
        """A selector other than GPUs: then only the selected jobs' GPUs are verified."""
        return bool(self.pids) or self.user is not None or self.match is not None


class ClearOptions(Record):
    """How ``clear`` acts (what it acts on is the :class:`Selection`). ``confirm`` is the one
    callable (a person reading the plan, a :class:`~gpuslate.clearing.plan.Plan`): a remote
    clear refuses it."""

    grace: float = option("--grace", parse=seconds, show=seconds_text, default=10.0, metavar="DURATION",
                          help="time between SIGTERM and SIGKILL (default 10s)")
    timeout: float = option("--timeout", parse=seconds, show=seconds_text, default=60.0, metavar="DURATION",
                            help="give up after this long in total, with a diagnosis (default 60s)")
    max_used: int | None = option("--max-used", parse=parse_size, show=size_text, default=None, metavar="SIZE",
                                  help=MAX_USED_HELP)
    dry_run: bool = flag("--dry-run", help="show the plan; signal nothing", consent=Consent.MOOT)
    confirm: Callable[[Any], bool] | None = field(
        default=None, why_here="a remote clear cannot ask for confirmation here: plan it with dry_run=True, "
        "then clear without confirm")

    def validate(self) -> ClearOptions:
        """:class:`~gpuslate.errors.UsageError` on a value no clear can act on."""
        check_seconds("--grace", self.grace)
        check_seconds("--timeout", self.timeout)
        check_size("--max-used", self.max_used)
        return self


class ClearLine(Record):
    selection: Selection = group(Selection)
    options: ClearOptions = group(ClearOptions)


class WaitOptions(Record):
    """How long ``wait`` waits and what counts as free."""

    max_used: int | None = option("--max-used", parse=parse_size, show=size_text, default=None, metavar="SIZE",
                                  help=MAX_USED_HELP)
    timeout: float = option("--timeout", parse=seconds, show=seconds_text, default=60.0, metavar="DURATION",
                            help="give up after this long (default 60s)")

    def validate(self) -> WaitOptions:
        check_seconds("--timeout", self.timeout)
        check_size("--max-used", self.max_used)
        return self


class WaitLine(Record):
    free: bool = flag("--free", default=True, required=True, help="wait for the GPUs to be free")
    gpus: tuple[int, ...] | None = option(
        "--gpus", parse=gpu_selection, show=gpus_text, default=None, metavar="LIST",
        help="GPUs to wait for, e.g. 0,2-3 or all (default: all)")
    options: WaitOptions = group(WaitOptions)


# -- units -----------------------------------------------------------------------------------------


class UnitFlags(Record):
    """A unit's spec as ``up``'s options give it: each None (not given) leaves the unit file's (or
    the last run's) value; a whole spec sent to another host gives every field."""

    gpus: list[int] | str | None = option(
        "--gpus", parse=unit_gpus, show=unit_gpus_text, default=None, metavar="LIST",
        help="GPUs of the unit, exported as CUDA_VISIBLE_DEVICES, e.g. 0-7; all: every GPU (its environment's "
        "CUDA_VISIBLE_DEVICES left as it is)")
    port: int | None = option("--port", parse=port, default=None, metavar="PORT",
                              help="the port it serves on (checked unused first)")
    ready_host: str | None = option("--ready-host", parse=text, default=None, metavar="ADDR",
                                    help="address readiness checks use (default 127.0.0.1)")
    engine: str | None = option("--engine", parse=text, default=None, choices="gpuslate.units.spec:ENGINES",
                                help="readiness like the engine's own servers (each engine's check: docs/engines.md)")
    ready_url: str | None = option("--ready", parse=text, default=None, metavar="URL",
                                   help="ready when GET URL (or a path) answers 200")
    ready_log: str | None = option("--ready-log", parse=text, default=None, metavar="REGEX",
                                   help="ready when a log line matches REGEX")
    smoke: bool | None = flag("--smoke", default=None, help="once ready, send one real 1-token completion")
    model: str | None = option("--model", parse=text, default=None,
                               help="model name for --smoke (default: the first of /v1/models)")
    start_timeout: float | None = option("--start-timeout", parse=positive_seconds, show=seconds_text,
                                         default=None, metavar="DURATION",
                                         help="most time to become ready (default 900s, 15m)")
    grace: float | None = option("--grace", parse=seconds, show=seconds_text, default=None, metavar="DURATION",
                                 help="SIGTERM to SIGKILL when stopping (default 10s)")
    stop_timeout: float | None = option("--stop-timeout", parse=seconds, show=seconds_text, default=None,
                                        metavar="DURATION", help="stopping including GPU memory release (default 60s)")
    env: tuple[str, ...] = options("--env", parse=env_item, metavar="KEY=VALUE",
                                   help="set in the server's environment (repeatable)")
    cwd: str | None = option("--cwd", parse=text, default=None, metavar="DIR", help="working directory of the server")
    containment: Containment | None = option(
        "--containment", parse=containment, default=None, choices=tuple(c.value for c in Containment),
        help="how the unit is fenced in (default auto: cgroup, else systemd scope, else session)")
    front: str | None = option(
        "--front", parse=front_address, default=None, metavar="[HOST:]PORT",
        help="clients use PORT (on 127.0.0.1 unless HOST is given): a proxy (Caddy, the front extra) that "
        "holds their requests while swap or restart replaces the unit")
    park: ParkWay | None = option(
        "--park-method", parse=park_way, default=None, choices=PARK_WAYS,
        help="how 'park' and 'swap --park' park it (default auto: what its command makes possible; docs/units.md)")

    def overrides(self) -> dict[str, Any]:
        """The fields given, as the unit spec's (``env`` as a mapping): what ``spec_for`` lays over a unit."""
        given = self._asdict()
        given["env"] = dict(item.partition("=")[::2] for item in self.env) if self.env else None
        return given

    def given(self) -> list[str]:
        """The options given, as the user wrote them (``--ready``, ``--start-timeout``)."""
        return [f.arg.long for name, f in type(self)._fields.items()
                if f.arg is not None and getattr(self, name) not in (None, ())]


class UpOptions(Record):
    """How ``up`` starts a unit (what it starts is the unit's spec)."""

    clear_first: bool = flag("--clear", help="clear the GPUs first (with 'gpuslate clear' rules: on a terminal, its "
                             "plan is shown and asked about; without one, --yes is needed)", consent=Consent.WIDENS)
    max_used: int | None = option("--max-used", parse=parse_size, show=size_text, default=None, metavar="SIZE",
                                  help="most memory a free GPU may show (default: as clear)")
    #: with ``clear_first``: asked with clear's plan before any signal (a person at a terminal)
    confirm: Callable[[Any], bool] | None = field(
        default=None, why_here="a remote up cannot ask for confirmation here: plan the clear with "
        "'clear --dry-run' there, then up without confirm")

    def validate(self) -> UpOptions:
        check_size("--max-used", self.max_used)
        return self


class UpLine(Record):
    names: tuple[str, ...] = positional("NAME", parse=unit_name, nargs="*", default=(),
                                        help="the unit (several: from the unit file; none: every unit of the file)")
    config: str | None = option("--config", parse=text, default=None, metavar="PATH", help=CONFIG_HELP)
    unit: UnitFlags = group(UnitFlags)
    options: UpOptions = group(UpOptions)
    command: tuple[str, ...] = rest(help="the server's command and its arguments, after --")


class DownOptions(Record):
    """How ``down`` stops a unit; None: the unit's own setting."""

    grace: float | None = option("--grace", parse=seconds, show=seconds_text, default=None, metavar="DURATION",
                                 help="default: the unit's (10s)")
    timeout: float | None = option(
        "--timeout", parse=seconds, show=seconds_text, default=None, metavar="DURATION",
        help="for stopping and memory release together (default: the unit's stop timeout, 60s)")
    max_used: int | None = option("--max-used", parse=parse_size, show=size_text, default=None, metavar="SIZE",
                                  help="most memory a free GPU may show (default: as clear)")
    clear_strays: bool = flag(
        "--clear", help="kept for scripts: ends nothing down does not (a process not proven the unit's is never "
        "signaled; it is named with the 'gpuslate clear --pid N' that ends it)")

    def validate(self) -> DownOptions:
        check_seconds("--grace", self.grace)
        check_seconds("--timeout", self.timeout)
        check_size("--max-used", self.max_used)
        return self


class DownLine(Record):
    names: tuple[str, ...] = positional("NAME", parse=unit_name, nargs="*", default=(),
                                        help="the unit (none: every unit of the unit file)")
    config: str | None = option("--config", parse=text, default=None, metavar="PATH", help=NAMELESS_CONFIG_HELP)
    options: DownOptions = group(DownOptions)


class SwapOptions(Record):
    """How ``swap`` replaces a unit."""

    rollback: bool = flag("--rollback", help="if NEW fails, start OLD again")
    config: str | None = option("--config", parse=text, default=None, metavar="PATH", help=CONFIG_HELP)
    prefetch: bool = flag("--no-prefetch", default=True, set_to=False,
                          help="do not read NEW's weight files into the page cache before stopping OLD")
    #: bound for the prefetch instead of the host's MemAvailable
    prefetch_memory: int | None = field(default=None, why_here="a remote swap takes the prefetch bounds of the host "
                                        "it runs on: leave prefetch_memory and prefetch_timeout unset")
    #: most seconds OLD keeps serving while NEW's weights are read
    prefetch_timeout: float = field(default=600.0, why_here="a remote swap takes the prefetch bounds of the host "
                                    "it runs on: leave prefetch_memory and prefetch_timeout unset")

    drain_timeout: float = option(
        "--drain-timeout", parse=seconds, show=seconds_text, default=60.0, metavar="DURATION",
        help="behind a front: the most the requests in flight on OLD may take to finish before it is stopped "
        "(what still runs then is cut, and counted; default 60s)")
    park: bool = flag("--park", help="park OLD instead of stopping it, and resume NEW if it is parked (else start "
                      "it): a switch in seconds between resident deployments on distinct ports (docs/units.md)")
    fallback: bool = flag("--no-fallback", default=True, set_to=False,
                          help="with --park: when OLD cannot be parked (or NEW resumed), stop there and say why, "
                          "instead of the cold stop and start")
    park_timeout: float = option(
        "--park-timeout", parse=seconds, show=seconds_text, default=60.0, metavar="DURATION",
        help="with --park: the most OLD's engine (or the driver) may take to release its memory, proven by NVML, "
        "before the fallback (park's --timeout; default 60s)")

    def validate(self) -> SwapOptions:
        check_seconds("prefetch timeout", self.prefetch_timeout)
        check_seconds("--drain-timeout", self.drain_timeout)
        check_seconds("--park-timeout", self.park_timeout)
        check_size("prefetch memory", self.prefetch_memory)
        return self


class SwapLine(Record):
    old: str = positional("OLD", parse=unit_name)
    new: str = positional("NEW", parse=unit_name)
    options: SwapOptions = group(SwapOptions)


class ParkOptions(Record):
    """How ``park`` parks a unit (``method`` None: the unit's own ``park`` setting, auto by default)."""

    method: ParkWay | None = option(
        "--method", parse=park_way, default=None, choices=tuple(w.value for w in ParkWay if w is not ParkWay.NONE),
        help="level1, level2 (the engine's own park), checkpoint (the driver's) or auto (default: the unit's "
        "park setting, else the first its command and processes make possible)")
    drain_timeout: float = option(
        "--drain-timeout", parse=seconds, show=seconds_text, default=60.0, metavar="DURATION",
        help="the most the requests in flight may take to finish first (default 60s)")
    timeout: float = option(
        "--timeout", parse=seconds, show=seconds_text, default=60.0, metavar="DURATION",
        help="the most the engine (or the driver) may take to release the memory, proven by NVML (default 60s)")
    max_used: int | None = option("--max-used", parse=parse_size, show=size_text, default=None, metavar="SIZE",
                                  help="most memory a parked unit's GPU may show besides its residue (default: as "
                                  "clear)")

    def validate(self) -> ParkOptions:
        check_seconds("--drain-timeout", self.drain_timeout)
        check_seconds("--timeout", self.timeout)
        check_size("--max-used", self.max_used)
        return self


class ParkLine(Record):
    name: str = positional("NAME", parse=unit_name)
    options: ParkOptions = group(ParkOptions)


class ResumeOptions(Record):
    """How ``resume`` brings a parked unit back (``timeout`` None: the unit's start timeout)."""

    timeout: float | None = option(
        "--timeout", parse=positive_seconds, show=seconds_text, default=None, metavar="DURATION",
        help="the most the memory may take to come back and the unit to serve again (default: its start timeout)")
    max_used: int | None = option("--max-used", parse=parse_size, show=size_text, default=None, metavar="SIZE",
                                  help="most memory a free GPU may show (default: as clear)")

    def validate(self) -> ResumeOptions:
        check_seconds("--timeout", self.timeout)
        check_size("--max-used", self.max_used)
        return self


class ResumeLine(Record):
    name: str = positional("NAME", parse=unit_name)
    options: ResumeOptions = group(ResumeOptions)


class RestartOptions(Record):
    """How ``restart`` goes."""

    prefetch: bool = flag("--prefetch", help="read its weight files into the page cache before stopping it, as "
                          "swap does (off: the server that just ran them has them cached)")
    drain_timeout: float = option(
        "--drain-timeout", parse=seconds, show=seconds_text, default=60.0, metavar="DURATION",
        help="behind a front: the most the requests in flight on it may take to finish before it is stopped "
        "(what still runs then is cut, and counted; default 60s)")

    def validate(self) -> RestartOptions:
        check_seconds("--drain-timeout", self.drain_timeout)
        return self


class RestartLine(Record):
    names: tuple[str, ...] = positional("NAME", parse=unit_name, nargs="*", default=(),
                                        help="the unit (none: every unit of the unit file that has run)")
    options: RestartOptions = group(RestartOptions)
    config: str | None = option("--config", parse=text, default=None, metavar="PATH", help=NAMELESS_CONFIG_HELP)


class RmLine(Record):
    names: tuple[str, ...] = positional("NAME", parse=unit_name, nargs="+", default=())


#: without ``all``, ``ps`` leaves out units stopped (or failed) longer ago than this
RECENT_S = 3600.0


class PsOptions(Record):
    """Which units ``ps`` lists. ``all`` (the library's default; the command's ``-a``): every unit
    recorded. Else, as ``docker ps`` leaves out stopped containers, the units stopped by ``down`` or
    failed in ``up`` more than ``recent_s`` ago are left out and counted (a unit stopped just now is
    still listed, so that a ``down`` shows as ``stopped``). A unit that exited by itself is listed
    until ``down`` or ``rm``: when it exited is not known, and a crash is news."""

    all: bool = flag("-a", "--all", default=True, help="also the units stopped more than an hour ago")
    recent_s: float = field(default=RECENT_S, why_here="a remote ps lists by the command's rule (stopped more "
                            "than an hour ago: hidden without all): leave recent_s unset")


class PsLine(Record):
    options: PsOptions = group(PsOptions)


class LogsOptions(Record):
    """What ``logs`` shows: the last ``tail`` lines (None: all) written at or after ``since`` (epoch
    seconds; None: from the first), with the time each was written when ``timestamps``."""

    tail: int | None = option("-n", "--tail", parse=tail, default=None, metavar="N", help="only the last N lines")
    since: float | None = option(
        "--since", parse=since, show=since_text, default=None, metavar="WHEN",
        help="only lines written since WHEN: a duration back from now (10m, 1h30m, 42s) or a time "
        "(2013-01-02T13:23:37Z; without a zone, local time; or Unix seconds), as docker logs --since")
    timestamps: bool = flag("-t", "--timestamps",
                            help="start each line with the time it was written (RFC 3339, UTC)")

    def validate(self) -> LogsOptions:
        if self.tail is not None and self.tail < 0:
            raise UsageError(f"invalid --tail {self.tail}: must be at least 0")
        return self


class LogsLine(Record):
    names: tuple[str, ...] = positional(
        "NAME", parse=unit_name, nargs="*", default=(),
        help="the unit; several: interleaved by time, each line after its unit's name (as docker compose logs); "
        "none: every unit (as ps -a lists them)")
    follow: bool = flag("-f", "--follow", help="keep printing new lines until the unit is gone (or Ctrl-C)",
                        why_here="logs --follow does not work with --host: run it on the host "
                        "(ssh -t HOST gpuslate ...)")
    options: LogsOptions = group(LogsOptions)


# -- the audit log ---------------------------------------------------------------------------------


class AuditOptions(Record):
    """Which entries ``audit`` lists: the newest ``limit`` (0: all). ``old_name``: asked for as
    ``gpuslate log``, the command's old name; the document keeps its old schema."""

    limit: int = option("--limit", parse=limit, default=50, metavar="N",
                        help="show the newest N entries (default 50; 0 shows all)")
    old_name: bool = alias("log", help="the command's old name: its document keeps its old schema (gpuslate.log.v1)")

    def validate(self) -> AuditOptions:
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 0:
            raise UsageError(f"invalid audit limit {self.limit!r}: must be a whole number of at least 0")
        return self


class AuditLine(Record):
    options: AuditOptions = group(AuditOptions)
