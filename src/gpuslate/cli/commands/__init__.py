"""A command is one row: :data:`COMMANDS` names, for each command word, its help summary (the line
``gpuslate --help`` shows), its declaration when it is a verb of a host (gpuslate/verbs.py: its
options, its document's type), the module under ``gpuslate.cli.commands`` that runs it, and its
document: the result type that reads it back (``from_json``) and the renderer that shows it
(``"module:attr"`` strings, imported when used, as pip's ``commands_dict``); and :func:`present` is
every command's one tail.

The summary is here so that ``gpuslate --help`` and shell completion import no command's module:
main.py makes each command's parser from its row, a verb's options from its declaration
(cli/commands/common.py: ``add_line``) and the others' from their module's ``build(parser)``, when
that command is the one chosen (or completion asks for every option); a command's module is imported
to run it. A verb's module (``run(args)``) imports what it needs at the top.

The table lives here, in the package of the command modules, not in main.py: main registers the
parsers from it, and cli/fleet.py reads remote documents with it (``gpuslate.NAME.v1`` -> the row's
result type -> its renderer), and neither should import the other. Documents that are no command's
name (``sim.init``, ``sim.leak``, the ``batch`` of ``up``/``down``/``restart`` with several units) are
in their command's row, under ``also``; ``log`` (the old name of ``audit``) is a row of its own, a
hidden command with its own ``gpuslate.log.v1``. Adding a command is one row, one module and one
renderer (and, for a verb, its declaration); tests/cli/test_command_table.py checks that every string
resolves, that each result type's document names its row, and that every command word argparse knows
has one.

A command's document is the contract (local output = remote bytes): :func:`present` shows a local
result as its document gives it back, by the renderer a remote host's document gets (``--host``).
Rows are plain slotted classes, not NamedTuples or dataclasses: each of those costs every
``status`` start-up (a NamedTuple class about 0.2 ms, ``dataclasses`` about 10 ms), and this module
is on its path. Nothing here imports a renderer, a result type or a command module before it is
used: ``status`` never loads rich or units/.
"""

from __future__ import annotations

import argparse
import importlib
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol

from ...verbs import AUDIT, CLEAR, DOWN, LOGS, PARK, PS, RESTART, RESUME, RM, STATUS, SWAP, UP, WAIT, Verb
from ..exits import ExitStatus, exit_status_of
from ..render.output import Mode, mode_of
from .common import print_json

if TYPE_CHECKING:  # Protocols for type checkers only: defining one at run time costs every start
    from ...outcome import HasStatus

    class Result(HasStatus, Protocol):
        """What every command result is: a versioned document with a status (its exit code)."""

        def to_json(self) -> dict[str, Any]: ...


class Document:
    """A ``gpuslate.NAME.v1`` document: the result type that reads it back, and how it is shown."""

    __slots__ = ("render", "result", "story", "views")

    def __init__(self, result: str, render: str, story: str | None = None, *,
                 views: tuple[tuple[str, str], ...] = ()) -> None:
        self.result = result  # "module:attr": the result type (its from_json reads the document back)
        self.render = render  # "module:attr": shows the result on stdout (a failure's story on stderr)
        #: "module:attr": with --json, the failure's story on stderr (stdout stays the document); it says
        #: nothing for a result that did not fail
        self.story = story
        #: (option's dest, "module:attr"): another view of the same document, chosen by a display option
        #: (``status --compact``), here as for each host of a fleet
        self.views = views

    def read(self, doc: object) -> Any:
        """The document as its result type (BadDocument for one that is not)."""
        return load(self.result).from_json(doc)

    def show(self, doc: object, args: argparse.Namespace | None = None) -> None:
        """Shown by its renderer, or by the view ``args`` asks for."""
        render = next((view for dest, view in self.views if getattr(args, dest, False)), self.render)
        load(render)(self.read(doc))


class Remote(Enum):
    """How ``--host``, ``--hosts`` and ``--slurm`` run a command (cli/fleet.py)."""

    FAN = "fan"  # on every host at once (--parallel)
    ROLLING = "rolling"  # one host at a time, stopping at the first that fails (unless --keep-going)
    HERE = "here"  # runs here and reaches each host itself (install: one zipapp, pushed to each)
    REFUSED = "refused"  # runs until killed: started on each host itself


class Command:
    """One command: the line of ``gpuslate --help`` (``summary``; ``hidden``: none), its
    declaration when it is a verb (``verb``: its options and help), the codes its help lists beside
    the common ones (``exits``; ``backend``: whether it opens the GPU backend, so that 3 is one of
    them), its module (a verb's ``run(args)``; another command's ``build(parser)`` too), its own
    document (``gpuslate.<command>.v1``; None for a command that has none), the documents it also
    prints (``sim``'s ``sim.init``, ``up``'s ``batch``...), what a lost stdout or stderr does to it
    (``output``, cli/render/output.py: a command that only prints stops; one that acts finishes its
    work and exits with its own code; a long run stops as on Ctrl-C), how other hosts run it
    (``remote``), and whether the host decides how long it takes (``paced``: a unit's timeouts, a
    spec's load; its answer then has no time limit here, only ssh's keep-alive and the byte and
    depth limits: docs/remote.md)."""

    __slots__ = ("also", "backend", "document", "exits", "module", "output", "paced", "remote", "summary", "verb")

    def __init__(self, module: str, document: Document | None, also: tuple[tuple[str, Document], ...] = (), *,
                 summary: str | None = None, verb: Verb[Any, Any] | None = None, exits: dict[int, str] | None = None,
                 backend: bool = True, hidden: bool = False, output: Mode = Mode.PRINT, remote: Remote = Remote.FAN,
                 paced: bool = False) -> None:
        self.module = module  # under gpuslate.cli.commands: run(args) (and build(parser), for a command no verb)
        self.document = document
        self.also = also
        #: the line of ``gpuslate --help`` (a verb's from its declaration); None: hidden from the list
        self.summary = None if hidden else summary if summary is not None or verb is None else verb.summary
        self.verb = verb
        self.exits = exits or {}
        self.backend = backend
        self.output = output
        self.remote = remote
        self.paced = paced


_R = "gpuslate.cli.render"
_BATCH = Document("gpuslate.units.batch:BatchResult", f"{_R}.units:show_batch", f"{_R}.units:report_batch_failures")
_AUDIT = Document("gpuslate.host.auditlist:AuditListing", f"{_R}.audit:print_log")
_ACT, _RUN, _ROLLING = Mode.ACT, Mode.RUN, Remote.ROLLING
_UP_EXITS = {0: "ready", 4: "not ready within --start-timeout, or its GPUs or port busy at pre-flight",
             5: "permission denied", 6: "the server failed (exited before ready, failed its smoke test)"}
_AUDIT_EXITS = {5: "the audit log or its folder is unsafe or unreadable"}

#: every command, in help order (the only list of them)
COMMANDS: dict[str, Command] = {
    "status": Command("status", Document("gpuslate.host.snapshot:Snapshot", f"{_R}.status:print_status",
                                         views=(("compact", f"{_R}.status:print_compact"),)),
                      verb=STATUS, exits={0: "shown (with --watch: ended by Ctrl-C)"}),
    "clear": Command("clear", Document("gpuslate.clearing.clear:ClearResult", f"{_R}.clear:print_clear"),
                     verb=CLEAR, output=_ACT, exits={
                         0: "clean (or --dry-run)", 4: "not free within --timeout, or held by processes that are "
                         "not targets (at once, with the diagnosis), or the host lock still held",
                         5: "permission denied on some target (the others were signaled), or an unsafe state folder",
                         130: "interrupted, or the confirmation answered no"}),
    "wait": Command("wait", Document("gpuslate.clearing.wait:WaitResult", f"{_R}.clear:print_wait"), verb=WAIT,
                    exits={0: "free", 4: "not free within --timeout (with a diagnosis)"}),
    "up": Command("up", Document("gpuslate.units.lifecycle:UpResult", f"{_R}.units:show_up",
                                f"{_R}.units:report_up_failure"), also=(("batch", _BATCH),), verb=UP, output=_ACT,
                  paced=True, exits={**_UP_EXITS, 7: "several units: one failed after others were started"}),
    "down": Command("down", Document("gpuslate.units.lifecycle:DownResult", f"{_R}.units:show_down",
                                     f"{_R}.units:report_down_failure"), verb=DOWN, output=_ACT, paced=True, exits={
                        0: "stopped and its GPU memory released", 2: "bad input, or unknown unit",
                        4: "not released in time (or held by processes not found in the unit: see --clear)",
                        5: "permission denied on some process", 7: "several units: some stopped, some not"}),
    "restart": Command("restart", Document("gpuslate.units.restart:RestartResult", f"{_R}.units:show_restart",
                                           f"{_R}.units:report_restart_failure"), verb=RESTART, output=_ACT,
                       remote=_ROLLING, paced=True, exits={
                           0: "ready again", 2: "bad input, or unknown unit",
                           4: "not stopped in time (not started again), or not ready in time",
                           5: "permission denied stopping it", 6: "it failed to start again",
                           7: "several units: one failed after others were restarted"}),
    "rm": Command("rm", Document("gpuslate.units.remove:RmResult", f"{_R}.units:show_rm"), verb=RM, output=_ACT,
                  exits={0: "removed", 2: "bad input, unknown unit, or a unit still running (nothing removed)",
                         5: "a file could not be removed"}),
    "ps": Command("ps", Document("gpuslate.units.listing:PsResult", f"{_R}.units:show_ps"), verb=PS,
                  exits={0: "listed", 5: "unsafe state folder"}),
    "logs": Command("logs", Document("gpuslate.units.logfile:LogsResult", f"{_R}.logs:show_logs"), verb=LOGS,
                    also=(("logs.many", Document("gpuslate.units.logfile:ManyLogs", f"{_R}.logs:show_many")),),
                    backend=False, exits={0: "printed (with --follow: until the unit is gone or Ctrl-C)",
                                          2: "bad input, unknown unit, --json with --follow, or --since on a log "
                                          "without line times"}),
    "swap": Command("swap", Document("gpuslate.units.swap:SwapResult", f"{_R}.units:show_swap",
                                     f"{_R}.units:report_swap_failure"), verb=SWAP, output=_ACT, remote=_ROLLING,
                    paced=True, exits={0: "NEW is ready", 4: "OLD not stopped in time (NEW not started), or NEW not "
                                       "ready in time, or (--park --no-fallback) OLD not parked: it serves again",
                                       5: "permission denied stopping OLD",
                                       6: "NEW failed (with --rollback, OLD is serving again if it could be "
                                       "restarted), or (--park --no-fallback) NEW not resumed"}),
    "park": Command("park", Document("gpuslate.units.park:ParkResult", f"{_R}.units:show_park",
                                     f"{_R}.units:report_park_failure"), verb=PARK, output=_ACT, paced=True, exits={
                        0: "parked and proven (or already parked)", 2: "bad input, unknown unit, or a unit not ready",
                        4: "refused by a guard (nothing changed), or its memory did not leave (undone)",
                        6: "the engine or the driver failed it, or the server died (a unit it left broken is named "
                        "so)"}),
    "resume": Command("resume", Document("gpuslate.units.park:ResumeResult", f"{_R}.units:show_resume",
                                         f"{_R}.units:report_resume_failure"), verb=RESUME, output=_ACT, paced=True,
                      exits={0: "serving again, with the same answer as before (or it was not parked)",
                             2: "bad input, unknown unit, or a unit not parked",
                             4: "no room on its GPUs (still parked), or not back or not serving in time",
                             6: "the engine or the driver failed it, the server died, or another answer than before "
                             "the park (named broken)"}),
    "audit": Command("audit", _AUDIT, verb=AUDIT, backend=False, exits=_AUDIT_EXITS),
    # the old name of audit: hidden (no summary), its document keeps its own schema
    "log": Command("audit", _AUDIT, verb=AUDIT, hidden=True, backend=False, exits=_AUDIT_EXITS),
    "sim": Command("sim", None, also=(
        ("sim.init", Document("gpuslate.gpu.simhost.results:SimInitResult", f"{_R}.sim:show_init")),
        ("sim.leak", Document("gpuslate.gpu.simhost.results:SimLeakResult", f"{_R}.sim:show_leak"))), output=_ACT,
        summary="simulated GPU hosts: sim init, sim hold, sim mps, sim leak, sim serve"),
    "bench": Command("bench", Document("gpuslate.bench.result:BenchResult", f"{_R}.bench:print_bench"), paced=True,
                     summary="load-test an OpenAI-compatible server (SGLang, vLLM, sim serve)"),
    # run: hours of servers and load, stopped as on Ctrl-C when its output goes (report: only prints)
    "experiment": Command("experiment", Document("gpuslate.bench.report:Report", f"{_R}.experiment:print_report"),
                          output=_RUN, paced=True,
                          summary="sweep deployments on a verified clean slate; compare; recommend"),
    "demo": Command("demo", Document("gpuslate.bench.report:DemoResult", f"{_R}.experiment:show_demo"), output=_RUN,
                    paced=True, summary="the whole loop on a simulated 8-GPU host: clear, swap, sweep, recommend"),
    "slurm": Command("slurm", Document("gpuslate.slurm.hooks:HookResult", f"{_R}.slurm:show_hook"), output=_ACT,
                     summary="Slurm node hooks: epilog (end the ended job's leftovers, verify its GPUs free) and "
                     "prolog (verify the job's GPUs free); drain the node otherwise"),
    "exporter": Command("exporter", None, output=_ACT, remote=Remote.REFUSED,  # serves until killed: no document
                        summary="serve Prometheus metrics: GPU memory by process, job, user and unit"),
    "install": Command("install", Document("gpuslate.remote.zipapp:InstallResult", f"{_R}.install:show_install"),
                       output=_ACT, remote=Remote.HERE,
                       summary="copy gpuslate to --host hosts over ssh (one file; no package index needed)"),
    "config": Command("config", Document("gpuslate.units.unitfile:ConfigResult", f"{_R}.units:show_config"),
                      summary="check the unit file and print it resolved (as docker compose config)"),
    "completion": Command("completion", None, summary="print a shell completion script: bash, zsh or fish"),
}


def load(ref: str) -> Any:
    """``"module:attr"``: the attribute, its module imported now."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def documents() -> dict[str, Document]:
    """Every document by its NAME (``gpuslate.NAME.v1``): each row's own, and those it lists under ``also``."""
    found = {name: c.document for name, c in COMMANDS.items() if c.document is not None}
    for c in COMMANDS.values():
        found.update(c.also)
    return found


def document_for(schema: object) -> Document | None:
    """The row's document for a ``gpuslate.NAME.v1`` schema; None for one without a renderer."""
    if not isinstance(schema, str) or not schema.startswith("gpuslate."):
        return None
    return documents().get(schema.removeprefix("gpuslate.").rsplit(".v", 1)[0])


def show_document(doc: dict[str, Any], args: argparse.Namespace | None = None) -> bool:
    """Show a command's document as the command shows its result (in the view ``args`` asks for);
    False when it has no renderer."""
    row = document_for(doc.get("schema"))
    if row is None:
        return False
    row.show(doc, args)
    return True


def present(args: argparse.Namespace, result: Result) -> ExitStatus:
    """Every command's tail: with ``--json`` the document (and, on stderr, a failure's story), else
    the result as its document gives it back, by its row's renderer; then the result's exit status."""
    doc = result.to_json()
    row = document_for(doc["schema"])
    if row is None:  # every result's document is in the table (tests/cli/test_command_table.py)
        raise AssertionError(f"no row of the command table shows {doc['schema']}")
    if getattr(args, "json", False):
        print_json(doc)
        if row.story is not None:  # stdout stays the document
            load(row.story)(row.read(doc))
    else:
        row.show(doc, args)
    return exit_status_of(result)


def output_mode(command: str | None, args: argparse.Namespace) -> Mode:
    """What a lost stdout or stderr does to ``command`` run with ``args``: its row's mode
    (cli/render/output.py's ``mode_of``: a dry run only prints); no command (``--help``): PRINT."""
    row = COMMANDS.get(command) if command is not None else None
    return mode_of(row.output if row is not None else Mode.PRINT, args)
