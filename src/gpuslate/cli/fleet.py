"""Global ``-H/--host``, ``--hosts FILE``, ``--group``, ``--parallel``: any command on remote hosts;
``--slurm``: on every node of the Slurm allocation it runs inside, through ``srun``.

``main`` takes these options off the command line (before or after the
command, never after ``--``), checks the rest with the local parser (bad
input fails here, before any host is contacted), then runs the same command
on every host as ``gpuslate COMMAND ARGS... --json``: a verb's words written
from its typed line by its declaration (gpuslate/verbs.py, as ``RemoteHost``
writes them), another command's as given. How the hosts are reached is a
transport's (remote/transport.py: ssh, srun, or the zipapp push of
``install``); this module only fans out through it and renders each host's
document with the renderers a local run uses, under a heading per host, and
a summary. It stays light to import: the heavy parts load on use.
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Any

from .._parse import parse_seconds
from .._record import Record
from ..errors import BadDocument, NotConfirmed, UsageError
from ..verbs import CLEAR, STATUS
from .commands import COMMANDS, Command, Remote, document_for, show_document
from .commands.common import print_json
from .exits import exit_code_of, fleet_exit_code
from .render.plain import Cell, Column, cut, paint, safe, table, use_color, width_of

if TYPE_CHECKING:
    from ..options import ClearLine
    from ..remote.fleet import FleetResult, HostOutcome
    from ..remote.transport import Transport

_VALUED = {"-H": "hosts", "--host": "hosts", "--hosts": "hosts_file", "--group": "group",
           "--parallel": "parallel", "--connect-timeout": "connect_timeout"}
_FLAGS = {"--keep-going": "keep_going", "--slurm": "slurm"}


class FleetArgs(Record):
    hosts: list[str]
    hosts_file: str | None
    group: str | None
    parallel: int
    connect_timeout: float
    keep_going: bool
    slurm: bool = False  # the nodes of the current Slurm allocation, through srun


def add_fleet_help(parser: argparse.ArgumentParser) -> None:
    """The options in ``gpuslate --help`` (``main`` takes them off before argparse parses)."""
    g = parser.add_argument_group("remote hosts (before or after the command; see docs/remote.md)")
    g.add_argument("-H", "--host", metavar="[USER@]HOST[:PORT]", action="append",
                   help="run the command on this host over ssh (repeatable)")
    g.add_argument("--hosts", metavar="FILE", help="inventory: one host a line, [group] sections, or Ansible INI")
    g.add_argument("--group", metavar="NAME", help="only this group of the --hosts inventory")
    g.add_argument("--parallel", metavar="N", help="hosts at a time (default 32)")
    g.add_argument("--connect-timeout", metavar="DURATION", help="ssh connect timeout per host (default 10s)")
    g.add_argument("--keep-going", action="store_true", help="swap, restart: go on to the next host after a failure")
    g.add_argument("--slurm", action="store_true",
                   help="inside a Slurm allocation: run the command on every node of it through srun "
                   "(see docs/slurm.md)")


def split_fleet_options(argv: Sequence[str]) -> tuple[FleetArgs | None, list[str]]:
    """(the fleet options, the rest of argv); ``None`` when no host was asked for."""
    found: dict[str, Any] = {"hosts": [], "hosts_file": None, "group": None, "parallel": None,
                             "connect_timeout": None, "keep_going": False, "slurm": False}
    rest: list[str] = []
    words: list[str] = []  # positional words so far: 'sim serve' owns its own --host (a bind address)
    it = iter(enumerate(argv))
    for i, arg in it:
        if arg == "--":
            rest += argv[i:]
            break
        # --name=VALUE, -H=VALUE, -HVALUE, or the value in the next word (as argparse reads them)
        name, eq, value = arg.partition("=") if arg.startswith("--") or arg[2:3] == "=" else (arg[:2], "", arg[2:])
        if name == "--host" and any(words[j:j + 2] == ["sim", "serve"] for j in range(len(words))):
            rest.append(arg)
            continue
        if name in _FLAGS and not eq:
            found[_FLAGS[name]] = True
            continue
        if name in _VALUED and (eq or value or arg == name):
            if not (eq or value):
                nxt = next(it, None)
                if nxt is None or nxt[1].startswith("-"):
                    raise UsageError(f"option {arg} needs a value")
                value = nxt[1]
            key = _VALUED[name]
            if key == "hosts":
                found["hosts"].append(value)
            else:
                found[key] = value
            continue
        if not arg.startswith("-"):
            words.append(arg)
        rest.append(arg)
    given = found["hosts"] or found["hosts_file"] is not None
    if found["slurm"] and given:
        raise UsageError("--slurm runs on the nodes of the current allocation: give it without --host/--hosts")
    if found["slurm"] and found["group"] is not None:
        raise UsageError("--group selects from a --hosts inventory, not from a Slurm allocation")
    if not given and not found["slurm"]:
        extra = [o for o, k in (("--group", "group"), ("--parallel", "parallel"),
                                ("--connect-timeout", "connect_timeout"), ("--keep-going", "keep_going"))
                 if found[k]]
        if extra:
            raise UsageError(f"{extra[0]} needs --host or --hosts FILE")
        return None, rest
    return FleetArgs(hosts=found["hosts"], hosts_file=found["hosts_file"], group=found["group"],
                     parallel=_number(found["parallel"], "--parallel", 32, int),
                     connect_timeout=_connect_timeout(found["connect_timeout"]),
                     keep_going=found["keep_going"], slurm=found["slurm"]), rest


def _connect_timeout(text: str | None) -> float:
    """``--connect-timeout``: a duration (seconds, or ``10s``, ``1m``), more than 0; default 10 s."""
    return 10.0 if text is None else parse_seconds(text, allow_zero=False, what="--connect-timeout")


def _number(text: str | None, option: str, default: Any, kind: type) -> Any:
    if text is None:
        return default
    try:
        v = kind(text)
    except ValueError:
        raise UsageError(f"invalid {option} {text!r}: a number") from None
    if not v > 0 or v == float("inf"):
        raise UsageError(f"invalid {option} {text!r}: must be greater than 0")
    return v


def remote_command(row: Command, args: argparse.Namespace, argv: Sequence[str]) -> list[str]:
    """The command as the remote gpuslate gets it (its words after ``gpuslate``), printing its
    document: a verb's written from the typed line the local parser read (its declaration's
    :meth:`~gpuslate.verbs.Verb.command`); a command that is no verb (bench, sim, experiment) has
    its options written by hand, and they go as given: the local ``--json`` dropped, one added
    (before a ``--``, after which words belong to the unit's command)."""
    if row.verb is not None:  # --yes: the consent given here (cli/main.py required it), for every host
        return row.verb.command(row.verb.read(args), sim=getattr(args, "sim", None), yes=getattr(args, "yes", False))
    cut = list(argv).index("--") if "--" in argv else len(argv)
    head = [a for a in argv[:cut] if a != "--json"]
    return [*head, "--json", *argv[cut:]]


class Progress:
    """``hosts 12/32 done (1 failed), 20 pending`` on a terminal's stderr, redrawn in place."""

    def __init__(self, total: int) -> None:
        self.enabled = sys.stderr.isatty()
        self._lock = threading.Lock()
        self.restart(total)

    def restart(self, total: int) -> None:
        self.total, self.ok, self.failed, self._drawn = total, 0, 0, False

    def done(self, outcome: HostOutcome) -> None:
        with self._lock:
            if outcome.ok:
                self.ok += 1
            else:
                self.failed += 1
            if self.enabled:
                finished = self.ok + self.failed
                sys.stderr.write(f"\rgpuslate: hosts {finished}/{self.total} done ({self.failed} failed), "
                                 f"{self.total - finished} pending ")
                sys.stderr.flush()
                self._drawn = True

    def close(self) -> None:
        with self._lock:
            if self._drawn:
                sys.stderr.write("\n")
                sys.stderr.flush()
                self._drawn = False


def run(fleet: FleetArgs, command: str, argv: Sequence[str], args: argparse.Namespace) -> int:
    """``gpuslate COMMAND`` (``argv``, already checked into ``args``) on every selected host."""
    if command == "sim" and getattr(args, "sim_command", None) in ("hold", "mps", "serve"):
        raise UsageError(f"'sim {args.sim_command}' runs until killed: start it on the host itself")
    row = COMMANDS[command]
    if row.remote is Remote.REFUSED:  # the exporter: Prometheus scrapes each host's own
        raise UsageError(f"'{command}' runs until killed: start it on each host (see docs/{command}.md)")
    words = remote_command(row, args, argv)  # what cannot be sent (--watch, --follow) is refused here
    # to be asked on this terminal (cli/main.py refused it without one): clear shows every host's plan
    asking = row.verb is not None and row.verb.needs_consent(row.verb.read(args)) and not args.yes
    if asking and row.verb is not CLEAR:
        raise UsageError(f"'{command}' with these options ends processes it does not name on each host, which "
                         "cannot be asked about here: add --yes (each host's plan: gpuslate --host HOST clear "
                         "--gpus LIST --dry-run)")
    transport = _transport(fleet, row, args)
    progress = Progress(len(transport.hosts))
    try:
        if asking:
            result = _clear_asking_once(transport, CLEAR.read(args), getattr(args, "sim", None), progress)
        elif row.remote is Remote.ROLLING:  # one host at a time: a rolling swap or restart
            result = transport.roll(transport.hosts, words, progress.done)
        else:
            result = transport.fan(transport.hosts, words, progress.done)
    finally:
        progress.close()
    result = read_back(result)
    if args.json:
        print_json(result.to_json(exit_code_of))
    else:
        print_fleet(result, command, args)
    return fleet_exit_code([exit_code_of(h) for h in result.hosts])


def _transport(fleet: FleetArgs, row: Command, args: argparse.Namespace) -> Transport:
    """How the hosts are reached (remote/transport.py): srun with ``--slurm``, else ssh; ``install``
    (run here, not there) pushes its zipapp over ssh."""
    from ..remote.ssh import SshOptions  # lazy: startup (--host only)
    from ..remote.transport import Srun, Ssh, read_inventory  # lazy: startup (--host only)

    if row.remote is Remote.HERE:  # install: builds the zipapp once here and pushes it to each host
        if fleet.slurm:
            raise UsageError("install copies gpuslate over ssh: give --host/--hosts, not --slurm")
        from ..remote.hosts import select_hosts  # lazy: startup (--host only)
        from .commands.install import push  # lazy: startup (--host only)

        inventory = read_inventory(fleet.hosts_file) if fleet.hosts_file is not None else None
        return push(args, select_hosts(fleet.hosts, inventory, fleet.group),
                    SshOptions.from_env(fleet.connect_timeout), fleet.parallel)
    limit = answer_limit(row, args, fleet.connect_timeout)
    if fleet.slurm:
        return Srun.from_env(keep_going=fleet.keep_going, timeout=limit)
    return Ssh.select(fleet.hosts, fleet.hosts_file, fleet.group, connect_timeout=fleet.connect_timeout,
                      parallel=fleet.parallel, keep_going=fleet.keep_going, timeout=limit,
                      fallback_status=row.verb is STATUS)


def answer_limit(row: Command, args: argparse.Namespace, connect_timeout: float) -> float | None:
    """The seconds one host's answer may take, its connection included: ``--connect-timeout``, plus the
    command's own ``--timeout`` and ``--grace`` (given or default), plus ``$GPUSLATE_ANSWER_MARGIN``
    (default 60); ``None`` for a command whose length the host decides (its row's ``paced``:
    cli/commands/__init__.py; ``experiment report`` excepted: it only reads)."""
    if row.paced and getattr(args, "verb", None) != "report":
        return None
    own = 0.0
    for name in ("timeout", "grace"):
        value = getattr(args, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            own += float(value)
    from ..remote.ssh import answer_margin  # lazy: startup (--host only)

    return connect_timeout + own + answer_margin()


def _clear_asking_once(transport: Transport, line: ClearLine, sim: str | None, progress: Progress) -> FleetResult:
    """Every host's plan (a dry run there), one question, then ``clear --yes`` where the plan was made."""
    from ..remote.fleet import FleetResult  # lazy: startup (--host only)

    dry = line._replace(options=line.options._replace(dry_run=True))
    plans = read_back(transport.fan(transport.hosts, CLEAR.command(dry, sim=sim), progress.done))
    progress.close()
    planned = [o.host for o in plans.hosts if o.ok]
    n = print_plans(plans)
    if not planned:
        return plans
    sys.stderr.write(f"Terminate {n} process{'es' if n != 1 else ''} on {len(planned)} "
                     f"host{'s' if len(planned) != 1 else ''}? [y/N] ")
    sys.stderr.flush()
    if sys.stdin.readline().strip().lower() not in ("y", "yes"):
        raise NotConfirmed("not confirmed: nothing was signaled")
    progress.restart(len(planned))
    done = transport.fan(planned, CLEAR.command(line, sim=sim, yes=True), progress.done)
    by_host = {o.host: o for o in done.hosts}
    return FleetResult(done.command, [by_host.get(o.host, o) for o in plans.hosts])


def read_back(result: FleetResult) -> FleetResult:
    """Every host's document read back into its result type: one that cannot be (another schema,
    malformed) makes that host failed (``bad_document``, exit 2), whatever its own exit status was.
    The document stays in the outcome (``--json`` shows what came), but is not rendered."""
    from ..remote.fleet import FleetResult, HostOutcome  # lazy: startup (--host only)

    hosts = []
    for o in result.hosts:
        doc = o.result
        row = document_for(doc.get("schema")) if doc is not None else None
        if row is not None and not isinstance(o.error, BadDocument):
            try:
                row.read(doc)
            except BadDocument as exc:
                o = HostOutcome(o.host, o.result, BadDocument(f"{o.host.label}: {exc}"), o.elapsed_s)
        hosts.append(o)
    return FleetResult(result.command, hosts)


def print_plans(plans: FleetResult) -> int:
    """Every host's clear plan (the dry runs), on stderr before the one question; the number of targets."""
    from ..clearing.clear import ClearResult  # lazy: startup (--host only)
    from .render.clear import print_plan  # lazy: startup (--host only)

    n = 0
    for o in plans.hosts:
        _heading(o, sys.stderr)
        if o.result is not None and o.ok:
            try:  # read back already (read_back), unless the host sent another command's document
                plan = ClearResult.from_json(o.result).plan
            except BadDocument as exc:
                _error_line(str(exc), exc.code, None, sys.stderr)
                continue
            n += len(plan.targets)
            print_plan(plan, file=sys.stderr)
        else:
            _error(o, sys.stderr)
    return n


def _heading(o: HostOutcome, out: IO[str]) -> None:
    line = f"── {safe(o.host.label)} ──"
    if o.result is not None and o.result.get("source") == "nvidia-smi":
        line += " (from nvidia-smi: gpuslate is not installed there)"
    out.write(paint(line, ("bold",), use_color(out)) + "\n")
    out.flush()


def _error_line(message: str, code: str, hint: str | None, out: IO[str]) -> None:
    color = use_color(out)
    out.write(f"{paint(f'error ({safe(code)}):', ('red',), color)} {safe(message)}\n")
    if hint:
        out.write(paint(f"hint: {safe(hint)}", ("dim",), color) + "\n")
    out.flush()


def _error(o: HostOutcome, out: IO[str]) -> None:
    if o.error is not None:
        _error_line(o.error.message, o.error.code, o.error.hint, out)


def _show(doc: dict[str, Any], args: argparse.Namespace | None) -> None:
    """One host's document, shown as the command shows its result locally (the command table's renderer,
    in the view ``args`` asks for)."""
    sys.stdout.flush()
    if not show_document(doc, args):
        _generic(doc)
    sys.stdout.flush()


def _generic(doc: dict[str, Any]) -> None:
    """A document without a renderer: its scalar fields, one a line (--json has everything)."""
    for k, v in doc.items():
        if isinstance(v, (str, int, float, bool)) or v is None:
            sys.stdout.write(f"  {safe(k)}: {cut(safe(v), 100)}\n")
        elif isinstance(v, (list, dict)):
            sys.stdout.write(f"  {safe(k)}: {len(v)} {'items' if isinstance(v, list) else 'fields'}\n")


_SUMMARY = (Column("Host"), Column("Result"), Column("Exit", "right"), Column("Time", "right"), Column("Detail"))


def print_fleet(result: FleetResult, command: str, args: argparse.Namespace | None = None) -> None:
    """Each host's result under its heading; then, for several hosts or a failure, a summary."""
    out = sys.stdout
    for o in result.hosts:
        _heading(o, out)
        if o.result is not None and not isinstance(o.error, BadDocument):  # read back: see read_back
            _show(o.result, args)
        _error(o, out)
    if len(result.hosts) == 1 and result.hosts[0].ok:
        return
    rows = []
    for o in result.hosts:
        res = Cell("ok", ("green",)) if o.ok else Cell(safe(o.error.code if o.error else "failed"), ("red",))
        detail = "" if o.error is None else cut(safe(o.error.message.removeprefix(f"{o.host.label}: ")), 80)
        if o.ok and o.result is not None and o.result.get("source") == "nvidia-smi":
            detail = "gpuslate missing: read-only view from nvidia-smi"
        rows.append([Cell(safe(o.host.label)), res, Cell(str(exit_code_of(o))), Cell(f"{o.elapsed_s:.2f}s"),
                     Cell(detail)])
    ok, n, color = sum(o.ok for o in result.hosts), len(result.hosts), use_color(out)
    out.write(f"\n{paint(safe(command), ('bold',), color)} on {n} host{'s' if n != 1 else ''}: "
              f"{ok} ok, {n - ok} failed\n")
    out.write("\n".join(table(_SUMMARY, rows, color=color, width=width_of(out), shrink=4, gap=2)) + "\n")
    out.flush()
