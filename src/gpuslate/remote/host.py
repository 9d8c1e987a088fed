"""Another host, with the same verbs as :class:`gpuslate.Host`, over ssh.

A :class:`RemoteHost` is to a host reached by ssh what :class:`gpuslate.Host` is
to this one: every verb of :class:`~gpuslate.verbs.Verbs` (``status()``,
``clear(selection, options)``, ``wait(...)``, ``up(spec or name)``, ``down(name)``,
``swap(old, new)``, ``restart(name)``, ``rm(names)``, ``ps()``, ``audit()``,
``logs(name)``), with the same signatures (mypy checks both classes against the
Protocol, at the end of this module), each returning the *same result type* a
local call returns. The wire is the command's versioned ``--json`` document: a
verb becomes the ``gpuslate`` command line that asks for exactly its input and
options (its declaration's line, gpuslate/verbs.py, written as words by
:meth:`~gpuslate.verbs.Verb.command`, as ``--host`` writes it), runs on the host
through the fleet's transport (:func:`~gpuslate.remote.fleet.run_on_host`:
connection sharing, the installed launcher, named transport failures), and its
document is read back with the result type's ``from_json``. So a result from
another host is the same object, and is rendered by the same function, as one
from here.

What cannot cross the wire is refused before anything runs, with a
:class:`~gpuslate.errors.UsageError` (each field says why where it is declared,
gpuslate/options.py): a ``confirm`` callback (a remote clear cannot ask a person
here; plan with ``dry_run`` first, then clear); a unit spec's explicit
``prefetch`` list (the remote host detects the model's files itself); a ``swap``
to a spec (NEW goes by name: the remote host resolves it from its unit file or
its last run, as ``gpuslate swap`` does; ``up`` takes a spec, or a name sent as
``up NAME``, resolved there alike); ``swap``'s prefetch bounds and ``ps``'s
``recent_s`` (the command takes the host's own); a ``logs`` ``since`` before
1970 (the command's ``--since`` takes a time); and any value the command's own
parser would not read back as itself (a NaN grace, a negative limit).
``status(full=False)`` is accepted and reads the full snapshot: the command has
no lighter reading (``full=False`` only leaves out the utilization and power a
caller does not show), and a full one answers it. A transport failure, or a
command that produced no document, raises the named
:class:`~gpuslate.errors.GpuslateError`; a command that ran and failed (a clear
that timed out, a unit that did not come up) returns its result, whose status
says so, as locally.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeVar

from .._record import Record
from ..errors import UsageError
from ..options import (
    AuditLine,
    AuditOptions,
    ClearLine,
    ClearOptions,
    Containment,
    DownLine,
    DownOptions,
    LogsLine,
    LogsOptions,
    ParkLine,
    ParkOptions,
    ParkWay,
    PsLine,
    PsOptions,
    RestartLine,
    RestartOptions,
    ResumeLine,
    ResumeOptions,
    RmLine,
    Selection,
    StatusLine,
    SwapLine,
    SwapOptions,
    UnitFlags,
    UpLine,
    UpOptions,
    WaitLine,
    WaitOptions,
)
from ..verbs import AUDIT, CLEAR, DOWN, LOGS, PARK, PS, RESTART, RESUME, RM, STATUS, SWAP, UP, WAIT, Verb
from .fleet import run_on_host
from .hosts import HostSpec, parse_host
from .ssh import SshOptions

if TYPE_CHECKING:
    from ..clearing.clear import ClearResult
    from ..clearing.wait import WaitResult
    from ..host.auditlist import AuditListing
    from ..host.snapshot import Snapshot
    from ..units.lifecycle import DownResult, UpResult
    from ..units.listing import PsResult
    from ..units.logfile import LogsResult
    from ..units.park import ParkResult, ResumeResult
    from ..units.remove import RmResult
    from ..units.restart import RestartResult
    from ..units.spec import UnitSpec
    from ..units.swap import SwapResult
    from ..verbs import Verbs

L = TypeVar("L", bound=Record)
R = TypeVar("R")


def unit_flags(spec: UnitSpec) -> UnitFlags:
    """Every field of ``spec`` as ``up``'s options (``up NAME [options] -- COMMAND``); what cannot be
    sent (an explicit prefetch list, an ``--env`` key with ``=``) is refused."""
    if spec.prefetch is not None:
        raise UsageError(f"unit {spec.name}: an explicit prefetch list cannot be sent to another host "
                         "(it detects the model's files itself); leave prefetch unset")
    if not spec.command:
        raise UsageError(f"unit {spec.name}: no command")
    if any("=" in key or not key for key in spec.env):
        raise UsageError(f"unit {spec.name}: an environment variable's name cannot be empty or hold '='")
    return UnitFlags(gpus=spec.gpus, port=spec.port, ready_host=spec.ready_host, engine=spec.engine,
                     ready_url=spec.ready_url, ready_log=spec.ready_log, smoke=spec.smoke or None, model=spec.model,
                     start_timeout=spec.start_timeout, grace=spec.grace, stop_timeout=spec.stop_timeout,
                     env=tuple(f"{k}={v}" for k, v in spec.env.items()), cwd=spec.cwd,
                     containment=Containment(spec.containment), front=spec.front, park=ParkWay(spec.park))


class RemoteHost:
    """Another host's GPUs and units, reached over ssh (see the module docstring).

    ``host``: ``[USER@]HOST[:PORT]`` or a :class:`HostSpec`; ``sim``: a simulated host's
    folder *on that host* (else its ``$GPUSLATE_SIM``, else its NVIDIA driver); ``ssh``:
    the transport's options (default: from the environment, as ``--host`` uses);
    ``timeout``: seconds for each command (None: the command's own limits).
    """

    def __init__(self, host: str | HostSpec, *, sim: str | None = None, ssh: SshOptions | None = None,
                 timeout: float | None = None) -> None:
        self.spec = host if isinstance(host, HostSpec) else parse_host(host)
        self.sim = sim
        self.ssh = ssh if ssh is not None else SshOptions.from_env()
        self.timeout = timeout

    @property
    def name(self) -> str:
        return self.spec.label

    def run(self, verb: Verb[L, R], line: L) -> R:
        """Run ``verb`` with ``line`` there; its result read back from its document, or the named failure
        raised (what the line cannot carry is refused first, before anything is sent). The caller is the
        consent: ``--yes`` is sent where the line needs it (nobody there can be asked)."""
        outcome = run_on_host(self.spec, verb.command(line, sim=self.sim, yes=True), self.ssh, timeout=self.timeout)
        if outcome.result is None:
            assert outcome.error is not None
            raise outcome.error
        return verb.read_result(outcome.result)

    def status(self, gpus: Sequence[int] | None = None, *, full: bool = True) -> Snapshot:
        """The snapshot there; ``full=False`` is accepted and reads the full one (the command has no
        lighter reading: see the module docstring)."""
        return self.run(STATUS, StatusLine(gpus=tuple(gpus) if gpus is not None else None))

    def clear(self, selection: Selection | None = None, options: ClearOptions | None = None) -> ClearResult:
        """Sent with ``--yes``: nobody there can be asked (see ``confirm``, refused)."""
        return self.run(CLEAR, ClearLine(selection=selection or Selection(), options=options or ClearOptions()))

    def wait(self, gpus: Sequence[int] | None = None, options: WaitOptions | None = None) -> WaitResult:
        return self.run(WAIT, WaitLine(gpus=tuple(gpus) if gpus is not None else None,
                                       options=options or WaitOptions()))

    def up(self, unit: str | UnitSpec, options: UpOptions | None = None) -> UpResult:
        """``unit``: a spec (sent whole), or a name the remote host resolves from its unit file or
        the unit's last run, as ``gpuslate up NAME`` does there."""
        if isinstance(unit, str):
            return self.run(UP, UpLine(names=(unit,), options=options or UpOptions()))
        spec = unit.validate()
        return self.run(UP, UpLine(names=(spec.name,), unit=unit_flags(spec), options=options or UpOptions(),
                                   command=tuple(spec.command)))

    def down(self, name: str, options: DownOptions | None = None) -> DownResult:
        return self.run(DOWN, DownLine(names=(name,), options=options or DownOptions()))

    def swap(self, old: str, new: str | UnitSpec, options: SwapOptions | None = None) -> SwapResult:
        """``new``: the name of a unit the remote host knows (its unit file or a previous ``up``); a
        spec is refused (a UsageError), as it cannot be sent."""
        if not isinstance(new, str):
            raise UsageError(f"a remote swap takes NEW by name, not a spec ({new.name}): the host it runs on "
                             "resolves it from its unit file or the unit's last run, as 'gpuslate swap' does")
        return self.run(SWAP, SwapLine(old=old, new=new, options=options or SwapOptions()))

    def restart(self, name: str, options: RestartOptions | None = None) -> RestartResult:
        """Restart unit ``name`` there, as it last ran there."""
        return self.run(RESTART, RestartLine(names=(name,), options=options or RestartOptions()))

    def rm(self, names: Sequence[str]) -> RmResult:
        """Remove units nothing of which runs there (their records and logs)."""
        wanted = tuple([names] if isinstance(names, str) else names)
        if not wanted:
            raise UsageError("rm needs the names of the units to remove")
        return self.run(RM, RmLine(names=wanted))

    def ps(self, options: PsOptions | None = None) -> PsResult:
        return self.run(PS, PsLine(options=options or PsOptions()))

    def audit(self, options: AuditOptions | None = None) -> AuditListing:
        """The newest entries of the audit log there (its simulated host's, with ``sim``)."""
        return self.run(AUDIT, AuditLine(options=options or AuditOptions()))

    def logs(self, name: str, options: LogsOptions | None = None) -> LogsResult:
        """Unit ``name``'s last lines there (a snapshot)."""
        return self.run(LOGS, LogsLine(names=(name,), options=options or LogsOptions()))

    def park(self, name: str, options: ParkOptions | None = None) -> ParkResult:
        """Park unit ``name`` there."""
        return self.run(PARK, ParkLine(name=name, options=options or ParkOptions()))

    def resume(self, name: str, options: ResumeOptions | None = None) -> ResumeResult:
        """Resume parked unit ``name`` there."""
        return self.run(RESUME, ResumeLine(name=name, options=options or ResumeOptions()))

    def __enter__(self) -> RemoteHost:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


if TYPE_CHECKING:
    def _remote_host_has_every_verb(host: RemoteHost) -> Verbs:
        """mypy checks :class:`RemoteHost` against :class:`~gpuslate.verbs.Verbs` here, structurally."""
        return host
