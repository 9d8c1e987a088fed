"""The verbs of a host, each declared once; and the typed Protocol that :class:`gpuslate.Host` (this
host) and :class:`gpuslate.RemoteHost` (another, over ssh) both are.

A declaration names everything about a verb that is not its code:

    CLEAR: Verb[ClearLine, ClearResult] = Verb(
        "clear", ClearLine, "gpuslate.clearing.clear:ClearResult", signals=True,
        summary="terminate the jobs holding GPUs ...", description="Plan, act, verify: ...",
        examples=[("the plan: what would be signaled", "gpuslate clear --gpus 0-3 --dry-run"), ...])

its command word; its command line, a record whose fields carry their flags, parsers, help and
defaults (:mod:`gpuslate.options`: ``ClearLine`` is the selection and the options); the
type its document reads back as; whether it signals processes; and its help. From it, generic code
makes the rest: ``gpuslate clear``'s argparse options and the step from the parsed command line to
the typed line (cli/commands/common.py), the command line another host is sent
(:meth:`Verb.command`: ``RemoteHost`` and ``--host`` alike), and the help and completion that list
it without importing any command's module (the command table, cli/commands/__init__.py).

What stays written per verb is what differs by verb, and is typed: its method on :class:`Verbs`
(below), ``Host``'s (api.py: a typed import of its implementation, called with the defaults filled
in) and ``RemoteHost``'s (remote/host.py: the line it sends), each a line or two that mypy checks
against this Protocol; its implementation; its command module (cli/commands/NAME.py: what the
command does around the call, a live line, Ctrl-C); its renderer. Adding ``park NAME --method M``
is a ``ParkOptions`` and ``ParkLine`` in options.py, a ``PARK`` here, those methods, its
implementation and its row and renderer in cli/.

``signals``: the verb may signal processes. A command that signals never takes silence for consent
(:meth:`Verb.needs_consent`): every verb declared ``signals=True`` takes ``-y/--yes`` (added from
here, not written in its line), and one whose run needs consent asks on a terminal and, without a
terminal on stdin and without ``--yes``, starts nothing and exits 2 (cli/main.py, for every verb
alike; a new verb gets the rule by its declaration). What needs consent: signals to processes the
command line does not name, chosen by a rule from what holds the GPUs (``clear``'s plan, ``up
--clear``), as ``apt-get``, ``docker system prune`` or ``terraform apply`` ask before acting on what
they chose. ``named=True`` declares a verb that signals only the processes of the units it names
(proven theirs by ties: ``down web``, ``swap``, ``restart``): the name is the consent, as ``docker
compose down``, ``systemctl stop`` and ``kill PID`` ask nothing, unless a flag of its line marked
``Consent.WIDENS`` is given (``up --clear``). A flag marked ``Consent.MOOT`` (``--dry-run``) signals
nothing: no consent. The library (``Host.clear``...) and a ``RemoteHost`` need none: the caller is
the consent (a remote command gets ``--yes``); nor the Slurm hooks, run by slurmd.

Why this module stays light: ``gpuslate status`` imports it (its declaration), so it imports only
:mod:`gpuslate.options` and the record idiom; the result types are named as ``"module:attr"`` and
imported when a document is read, and every type the Protocol names is imported for type checkers
only. ``api`` (the local host) sits above ``clearing/`` and ``units/``, and ``remote/`` beside it: a
module both can import without an upward import or a cycle is one that imports neither.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from ._record import Consent, Record
from .commandline import alias_of, consent_flags, consent_marks, read, words
from .options import (
    AuditLine,
    ClearLine,
    DownLine,
    LogsLine,
    ParkLine,
    PsLine,
    RestartLine,
    ResumeLine,
    RmLine,
    StatusLine,
    SwapLine,
    UpLine,
    WaitLine,
)

if TYPE_CHECKING:
    from .clearing.clear import ClearResult
    from .clearing.wait import WaitResult
    from .host.auditlist import AuditListing
    from .host.snapshot import Snapshot
    from .options import (
        AuditOptions,
        ClearOptions,
        DownOptions,
        LogsOptions,
        ParkOptions,
        PsOptions,
        RestartOptions,
        ResumeOptions,
        Selection,
        SwapOptions,
        UpOptions,
        WaitOptions,
    )
    from .units.lifecycle import DownResult, UpResult
    from .units.listing import PsResult
    from .units.logfile import LogsResult
    from .units.park import ParkResult, ResumeResult
    from .units.remove import RmResult
    from .units.restart import RestartResult
    from .units.spec import UnitSpec
    from .units.swap import SwapResult

L = TypeVar("L", bound=Record)
R = TypeVar("R")


class Verb(Generic[L, R]):
    """One verb: its command word (``name``), its command line (``line``: a record of its options,
    see :mod:`gpuslate.options`), the result type its document reads back as (``"module:attr"``),
    whether it may signal processes (``named``: only the units it names; see the module docstring), and its
    help (``summary``: the line in ``gpuslate --help``; ``examples``: the lines its ``--help`` ends with)."""

    __slots__ = ("description", "examples", "line", "name", "named", "result", "signals", "summary", "usage")

    def __init__(self, name: str, line: type[L], result: str, *, summary: str, description: str,
                 signals: bool = False, named: bool = False, usage: str | None = None,
                 examples: Sequence[tuple[str, str]] = ()) -> None:
        self.name, self.line, self.result, self.signals, self.named = name, line, result, signals, named
        self.summary, self.description, self.usage, self.examples = summary, description, usage, tuple(examples)

    def needs_consent(self, line: L) -> bool:
        """Whether running ``line`` needs a person's consent: a terminal's answer, or ``--yes``. A verb
        that signals needs it unless a MOOT flag is given (``--dry-run``: it signals nothing) or it is
        ``named`` (it signals only the units it names) and no WIDENS flag is given (``up --clear``)."""
        if not self.signals:
            return False
        marks = consent_marks(line)
        if Consent.MOOT in marks:
            return False
        return not self.named or Consent.WIDENS in marks

    def yes_help(self) -> str:
        """``--yes``'s help for this verb, said from its declaration."""
        if not self.named:
            return "go ahead without asking; needed when stdin is not a terminal (a script, a pipe, cron)"
        widening = consent_flags(self.line)
        if widening:
            return (f"go ahead without asking; needed with {' or '.join(widening)} when stdin is not a terminal "
                    "(it ends processes this command does not name)")
        return (f"accepted, never needed: {self.name} signals only the processes of the units it names "
                "(the name is the consent, as docker compose down)")

    def read(self, values: object) -> L:
        """The typed line a parsed command line (argparse's Namespace) gives."""
        return read(self.line, values)

    def command(self, line: L, *, sim: str | None = None, yes: bool = False) -> list[str]:
        """The gpuslate command (the words after ``gpuslate``) that runs this verb with ``line`` on
        another host and prints its document: refused (UsageError) before anything is sent when
        the line has what a command line cannot carry (see :func:`gpuslate.commandline.words`).
        ``yes``: the consent given here (a terminal's answer, ``--yes``, a library caller), sent as
        ``--yes`` where the line needs it (nobody there can be asked)."""
        consent = ["--yes"] if yes and self.needs_consent(line) else []
        return [alias_of(line) or self.name,
                *words(line, before_rest=[*consent, "--json", *([f"--sim={sim}"] if sim else [])])]

    def read_result(self, doc: object) -> R:
        """The result type's reading of a document of this verb (BadDocument for one that is not)."""
        module, _, attr = self.result.partition(":")
        cls: Any = getattr(importlib.import_module(module), attr)
        return cls.from_json(doc)


_UP_USAGE = "%(prog)s NAME [options] -- COMMAND [ARGS...]\n       %(prog)s [NAME...] [options]"

STATUS: Verb[StatusLine, Snapshot] = Verb(
    "status", StatusLine, "gpuslate.host.snapshot:Snapshot",
    examples=[
        ("every GPU and the processes holding it, grouped under their launcher", "gpuslate status"),
        ("GPUs 0-3, one line each with a memory bar, every 2 s until Ctrl-C",
         "gpuslate status --gpus 0-3 --compact --watch 2s"),
        ("every host of an inventory, as one document", "gpuslate --hosts hosts.ini status --json")],
    summary="show every GPU and every process that holds it",
    description="Show every GPU (never truncated) with memory, utilization, temperature, power and P-state, "
    "and its processes grouped under their launcher.")

CLEAR: Verb[ClearLine, ClearResult] = Verb(
    "clear", ClearLine, "gpuslate.clearing.clear:ClearResult", signals=True,
    examples=[
        ("the plan: what would be signaled, and what is spared and why", "gpuslate clear --gpus 0-3 --dry-run"),
        ("end the jobs holding GPUs 0-3 and prove them free (a terminal is asked first)", "gpuslate clear --gpus 0-3"),
        ("in a script (no terminal to ask on): --yes, and at most 2 minutes",
         "gpuslate clear --gpus 0-3 --yes --timeout 2m"),
        ("only the job of PID 4242: it and everything its launcher started", "gpuslate clear --pid 4242 --yes")],
    summary="terminate the jobs holding GPUs (SIGTERM, grace, SIGKILL) and verify the memory is free",
    description="Plan, act, verify: terminate whole jobs holding the selected GPUs (your own processes unless "
    "--all-users), then wait until every GPU is free. Monitors, GPU daemons, gpuslate and its ancestors are never "
    "targets. With --pid, --user or --match and no --gpus, only the GPUs the selected jobs held are verified.")

WAIT: Verb[WaitLine, WaitResult] = Verb(
    "wait", WaitLine, "gpuslate.clearing.wait:WaitResult",
    examples=[
        ("in a job script: wait up to 5 minutes for GPUs 0-1 to be free",
         "gpuslate wait --free --gpus 0-1 --timeout 5m"),
        ("free means at most 1 GiB used on each", "gpuslate wait --free --max-used 1GiB")],
    summary="wait until GPUs are free; signals nothing",
    description="Return 0 as soon as the selected GPUs are free (no process with a context, used memory at most "
    "--max-used), 4 on timeout with a diagnosis. Signals nothing.")

UP: Verb[UpLine, UpResult] = Verb(
    "up", UpLine, "gpuslate.units.lifecycle:UpResult", signals=True, named=True, usage=_UP_USAGE,
    examples=[
        ("start a server as unit baseline on GPUs 0-7; return once it serves",
         "gpuslate up baseline --gpus 0-7 --port 30000 --engine sglang -- python -m sglang.launch_server "
         "--model-path /models/x --tp 8 --port 30000"),
        ("a unit of gpuslate.toml, or every unit of it", "gpuslate up baseline"),
        ("clear its GPUs first, in a script (--yes: no terminal to ask on)", "gpuslate up baseline --clear --yes")],
    summary="start a server as a managed unit and wait until it is ready",
    description="Start COMMAND as the managed unit NAME (its own session, process group and, where the host "
    "allows, cgroup), with its GPUs verified free and its port unused first, and return once it is ready. Units "
    "can be declared in gpuslate.toml: 'up A B' starts those, one after another, and 'up' alone every unit of the "
    "file, in its order, leaving those already running as they are and stopping at the first that fails (as "
    "'docker compose up'). See docs/units.md.")

DOWN: Verb[DownLine, DownResult] = Verb(
    "down", DownLine, "gpuslate.units.lifecycle:DownResult", signals=True, named=True,
    examples=[
        ("stop unit baseline and verify its GPU memory released", "gpuslate down baseline"),
        ("every unit of gpuslate.toml, as docker compose down", "gpuslate down"),
        ("a shorter grace and limit", "gpuslate down baseline --grace 5s --timeout 2m")],
    summary="stop a managed unit and verify its GPUs are released",
    description="SIGTERM every process of the unit (cgroup, session, process group), grace, SIGKILL; sweep "
    "processes of the unit that appeared meanwhile; then verify its GPU memory is released, as 'clear' does. A "
    "unit with a corrupt record is stopped by what can still be found of it (its cgroup, its instance's marker, "
    "its port); the record is then set aside. Only this unit instance's processes are reached (never another "
    "user's or another state folder's unit of the same name). 'down A B' stops those (in the reverse order, each "
    "even when another fails), 'down' alone every unit of the unit file, as 'docker compose down'.")

RESTART: Verb[RestartLine, RestartResult] = Verb(
    "restart", RestartLine, "gpuslate.units.restart:RestartResult", signals=True, named=True,
    examples=[
        ("stop unit speculative and start it as it last ran", "gpuslate restart speculative"),
        ("every unit of gpuslate.toml that has run", "gpuslate restart")],
    summary="stop a unit and start it again as it last ran",
    description="Stop the unit NAME (its GPUs verified free, as 'down') and start it again with the spec it last "
    "ran with, under one hold of the host lock, the downtime measured as 'swap' measures it; a unit nothing of "
    "which runs is just started. As 'docker compose restart': the unit file's changes since are not taken "
    "('down' then 'up' takes them). Several NAMEs: one after another, stopping at the first that fails; none: "
    "every unit of the unit file that has run. See docs/units.md.")

RM: Verb[RmLine, RmResult] = Verb(
    "rm", RmLine, "gpuslate.units.remove:RmResult",
    examples=[("forget two stopped units: their records and logs", "gpuslate rm baseline speculative")],
    summary="remove stopped units: their records and logs",
    description="Remove the record and the logs of each unit NAME, which must be stopped, failed or exited; a "
    "running unit (starting, ready, or orphaned: processes of it still run) or one whose record is corrupt is "
    "refused, and then nothing is removed (stop it with 'gpuslate down NAME' first). As 'docker rm'. The audit "
    "log keeps every signal sent to it. See docs/units.md.")

PS: Verb[PsLine, PsResult] = Verb(
    "ps", PsLine, "gpuslate.units.listing:PsResult",
    examples=[
        ("the units and their state", "gpuslate ps"),
        ("also those stopped more than an hour ago, as a document", "gpuslate ps -a --json")],
    summary="list managed units: state, pid, uptime, port, GPUs, memory, time to ready",
    description="List managed units with their state as the host shows it now: starting, ready, exited, failed, "
    "stopped, orphaned (the main process died while processes of the unit live on, or 'up' vanished before it was "
    "ready; 'gpuslate down NAME' cleans them up), or corrupt (its record cannot be read). Like 'docker ps', units "
    "stopped (or failed) more than an hour ago are left out unless -a; a unit that exited by itself is listed "
    "until 'gpuslate down' or 'gpuslate rm'.")

LOGS: Verb[LogsLine, LogsResult] = Verb(
    "logs", LogsLine, "gpuslate.units.logfile:LogsResult",
    examples=[
        ("a unit's output as it comes, until it is gone", "gpuslate logs baseline --follow"),
        ("two units' last 20 lines each, interleaved by time", "gpuslate logs baseline speculative --tail 20"),
        ("every unit's output of the last 10 minutes, with each line's time",
         "gpuslate logs --since 10m --timestamps")],
    summary="show units' output (stdout and stderr)",
    description="Print a unit's log (its stdout and stderr, rotated at every start: older runs are NAME.log.1 ... "
    ".5 next to it). The server's output is printed as it wrote it, like 'docker logs'; the time of each line is "
    "recorded as it is written. Several units ('logs A B'), or every unit ('logs' alone, as 'ps -a' lists them): "
    "their lines interleaved by the time each was written, each after its unit's name, as 'docker compose logs' "
    "(--tail: per unit; --follow: until every one is gone).")

SWAP: Verb[SwapLine, SwapResult] = Verb(
    "swap", SwapLine, "gpuslate.units.swap:SwapResult", signals=True, named=True,
    examples=[
        ("replace unit baseline by unit speculative; baseline back if speculative fails",
         "gpuslate swap baseline speculative --rollback"),
        ("on every host of an inventory, one after another", "gpuslate --hosts hosts.ini swap baseline speculative"),
        ("between resident deployments: park baseline, resume speculative (a cold swap where either fails)",
         "gpuslate swap baseline speculative --park")],
    summary="down OLD, verify its GPUs clean, up NEW and wait until it serves",
    description="Replace unit OLD by unit NEW under the host lock: down OLD, verify its GPUs are clean, up NEW "
    "(from gpuslate.toml or its last run) and wait until it is ready; each phase timed. With --rollback, if NEW "
    "fails, OLD is started again and made ready. With --park, OLD is parked instead of stopped and NEW resumed if "
    "it is parked (a switch in seconds between resident deployments on distinct ports), falling back to the cold "
    "way, saying why, where a park or a resume fails (unless --no-fallback).")

PARK: Verb[ParkLine, ParkResult] = Verb(
    "park", ParkLine, "gpuslate.units.park:ParkResult",
    examples=[
        ("release unit baseline's GPU memory while it lives (the unit's park setting, else auto)",
         "gpuslate park baseline"),
        ("by the driver's checkpoint, the memory proven free within 2 minutes",
         "gpuslate park baseline --method checkpoint --timeout 2m")],
    summary="release a unit's GPU memory while it lives (its engine's sleep, or the driver's checkpoint), proven",
    description="Park unit NAME: its new requests held (behind a front) and those in flight drained, then its "
    "engine's own park (vLLM's sleep, SGLang's release; started with the engine's flag) or the driver's "
    "checkpoint of its one CUDA process, and NVML's proof that every process of it let go of its GPU memory down to "
    "its method's residue. A park that did not free the memory is undone. Guards refuse first: host memory for "
    "what moves there, one process for the checkpoint, a level a known fault rules out. 'gpuslate resume NAME' "
    "brings it back. Signals nothing. See docs/units.md, Park and resume.")

RESUME: Verb[ResumeLine, ResumeResult] = Verb(
    "resume", ResumeLine, "gpuslate.units.park:ResumeResult",
    examples=[
        ("bring unit baseline back: its memory, its readiness and the same answer as before",
         "gpuslate resume baseline"),
        ("at most 5 minutes for it to serve again", "gpuslate resume baseline --timeout 5m")],
    summary="bring a parked unit back: memory proven back, serving, and the same answer as before",
    description="Resume unit NAME: room on its GPUs checked first, then its engine's resume (or the driver's "
    "restore and unlock), its memory proven back on the same GPUs, its readiness, a warm-up completion, and a fixed "
    "prompt at temperature 0 answered with the same tokens as when it first became ready (else it fails, loudly, "
    "and the unit is named broken). Also ends a park or resume that was cut short (ps: interrupted). Signals "
    "nothing.")

AUDIT: Verb[AuditLine, AuditListing] = Verb(
    "audit", AuditLine, "gpuslate.host.auditlist:AuditListing",
    examples=[
        ("the last 50 signals gpuslate sent", "gpuslate audit"),
        ("every one, as a document", "gpuslate audit --limit 0 --json")],
    summary="show the audit log of every signal gpuslate sent",
    description="Show the audit log (newest last): who sent which signal to which process on which GPUs, and the "
    "outcome. An entry without an outcome belongs to a run that was interrupted after recording it. With a "
    "simulated host (--sim or GPUSLATE_SIM), only its entries.")


class Verbs(Protocol):
    """Every verb of a host: its input first, a small frozen options object last (None: the
    defaults), a result value with ``to_json()`` and a status back.

        def drain(host: Verbs, name: str) -> DownResult:
            return host.down(name, DownOptions(clear_strays=True))

    runs here or there alike, and a type checker holds both classes to these signatures: mypy
    checks each against this Protocol structurally (api.py and remote/host.py say so where they
    define them), so a verb added to one class, or typed differently on one, fails the type
    check, not a user."""

    def status(self, gpus: Sequence[int] | None = None, *, full: bool = True) -> Snapshot:
        """The selected GPUs (all by default) and every process that holds them."""
        ...

    def clear(self, selection: Selection | None = None, options: ClearOptions | None = None) -> ClearResult:
        """Plan, act, verify: the selected holders ended and the GPUs verified free."""
        ...

    def wait(self, gpus: Sequence[int] | None = None, options: WaitOptions | None = None) -> WaitResult:
        """Wait until the GPUs are free; signals nothing."""
        ...

    def up(self, unit: str | UnitSpec, options: UpOptions | None = None) -> UpResult:
        """Start a unit (a spec, or a name resolved as ``gpuslate up NAME`` does), once it serves."""
        ...

    def down(self, name: str, options: DownOptions | None = None) -> DownResult:
        """Stop a unit and verify its GPUs."""
        ...

    def swap(self, old: str, new: str | UnitSpec, options: SwapOptions | None = None) -> SwapResult:
        """Replace unit ``old`` by ``new`` under one lock."""
        ...

    def restart(self, name: str, options: RestartOptions | None = None) -> RestartResult:
        """Stop a unit and start it with the spec it last ran with."""
        ...

    def rm(self, names: Sequence[str]) -> RmResult:
        """Remove the records and logs of units nothing of which runs."""
        ...

    def ps(self, options: PsOptions | None = None) -> PsResult:
        """Every unit with its live state."""
        ...

    def audit(self, options: AuditOptions | None = None) -> AuditListing:
        """The newest entries of the audit log (every signal sent, and what became of it)."""
        ...

    def park(self, name: str, options: ParkOptions | None = None) -> ParkResult:
        """Release a unit's GPU memory while it lives, proven by NVML."""
        ...

    def resume(self, name: str, options: ResumeOptions | None = None) -> ResumeResult:
        """Bring a parked unit back, proven back and answering as before."""
        ...

    def logs(self, name: str, options: LogsOptions | None = None) -> LogsResult:
        """A unit's last lines (a snapshot)."""
        ...
