"""The public way in: :class:`Host`, the context of every operation, with the verbs as its methods.

    with gpuslate.Host.open(sim="/tmp/h") as host:
        snap = host.status()
        result = host.clear(Selection(gpus=(0,)), ClearOptions(grace=5))

Why here and not in ``host/``: the context (backend, lock, audit log, state
folder, event sink) is :class:`~gpuslate.host.session.HostContext`, which
``clearing/`` and ``units/`` import to do their work; the verbs are implemented
in those packages, so the facade that calls them must sit above both, or the
import graph would loop (host -> units -> host).

Each verb's method is its declaration's local side (gpuslate/verbs.py): the defaults filled in
(the options records of gpuslate/options.py, light to import), then its implementation, imported
inside the body (``# lazy: startup``): ``gpuslate status`` must not pay, at every start, for the
modules of ``clear`` or ``up``; ``status`` needs nothing more than the snapshot module imported
here. The imports are plain and typed, so a type checker sees every verb's real signature, and
:class:`Host` is checked against :class:`~gpuslate.verbs.Verbs`, the Protocol
:class:`~gpuslate.RemoteHost` is checked against too (the end of this module).

A composite verb (``swap``, ``restart``; ``up`` with ``clear_first``) calls its siblings on the same
context: one backend, one audit log, and the host lock taken once (re-entrant), with no ``lock=`` flag.

``status()``, ``clear()`` and ``wait_free()`` at the bottom are conveniences
for one call with keyword arguments (re-exported by ``gpuslate``); each opens
a :class:`Host` for that call and goes through it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .errors import GpuslateError
from .gpu import GpuBackend
from .host.session import HostContext, Note, ProgressSink
from .host.snapshot import Snapshot, take_snapshot
from .options import (
    AuditOptions,
    ClearOptions,
    DownOptions,
    LogsOptions,
    PsOptions,
    RestartOptions,
    Selection,
    SwapOptions,
    UpOptions,
    WaitOptions,
)

if TYPE_CHECKING:
    from .clearing.clear import ClearResult
    from .clearing.plan import Plan
    from .clearing.wait import WaitResult
    from .host.auditlist import AuditListing
    from .units.lifecycle import DownResult, UpResult
    from .units.listing import PsResult
    from .units.logfile import LogsResult
    from .units.remove import RmResult
    from .units.restart import RestartResult
    from .units.spec import UnitSpec
    from .units.swap import SwapResult
    from .verbs import Verbs


class Host(HostContext):
    """One host (the NVIDIA driver, or a simulated host), opened once for one command.

    The verbs are its methods; each takes its input and a small frozen options
    object (None: the defaults) and returns a result value with ``to_json()``.
    Used as a context manager, it closes the backend it opened.
    """

    @classmethod
    def open(cls, sim: str | None = None, *, backend: GpuBackend | None = None, on_event: Note | None = None,
             audit_context: dict[str, Any] | None = None, on_progress: ProgressSink | None = None) -> Host:
        """The simulated host ``sim`` (or ``$GPUSLATE_SIM``), else the NVIDIA driver; or ``backend``,
        which the caller keeps and closes. ``on_event`` receives progress lines, ``on_progress``
        the waits under way (:class:`~gpuslate.host.session.Progress`: a server loading, GPU
        memory still held), about four times a second while one lasts."""
        return cls(sim, backend=backend, on_event=on_event, audit_context=audit_context, on_progress=on_progress)

    def status(self, gpus: Sequence[int] | None = None, *, full: bool = True) -> Snapshot:
        """Snapshot of the selected GPUs (all by default) and every process that holds them."""
        return take_snapshot(self.backend, gpus, full=full)

    def clear(self, selection: Selection | None = None, options: ClearOptions | None = None) -> ClearResult:
        """Plan, act, verify: see :func:`gpuslate.clearing.clear.clear`."""
        from .clearing.clear import clear  # lazy: startup (status needs none of it)

        return clear(self, selection or Selection(), options or ClearOptions())

    def wait(self, gpus: Sequence[int] | None = None, options: WaitOptions | None = None) -> WaitResult:
        """Wait until the GPUs are free; signals nothing: see :func:`gpuslate.clearing.wait.wait_free`."""
        from .clearing.wait import wait_free  # lazy: startup (status needs none of it)

        return wait_free(self, gpus, options or WaitOptions(), owners=self._unit_owners)

    def _unit_owners(self) -> dict[int, str]:
        """pid -> the unit of this state folder it belongs to (for a remedy's wording only: a state
        folder that cannot be read names none)."""
        from .proc.tree import ProcTable  # lazy: startup
        from .units.store import UnitStore  # lazy: startup
        from .units.unit import load_units, unit_of_pids  # lazy: startup

        try:
            return unit_of_pids(load_units(UnitStore.of(self)), ProcTable())
        except (GpuslateError, OSError):
            return {}

    def up(self, unit: str | UnitSpec, options: UpOptions | None = None) -> UpResult:
        """Start a unit, return once it serves: see :func:`gpuslate.units.updown.up`. ``unit``: a
        spec, or a name resolved as ``gpuslate up NAME`` does (its table in the unit file, else the
        spec it last ran with: :func:`gpuslate.units.resolving.spec_for`)."""
        from .units.resolving import spec_for  # lazy: startup (status needs none of it)
        from .units.updown import up  # lazy: startup (status needs none of it)

        return up(self, spec_for(self, unit) if isinstance(unit, str) else unit, options or UpOptions())

    def down(self, name: str, options: DownOptions | None = None) -> DownResult:
        """Stop a unit, verify its GPUs: see :func:`gpuslate.units.updown.down`."""
        from .units.updown import down  # lazy: startup (status needs none of it)

        return down(self, name, options or DownOptions())

    def swap(self, old: str, new: str | UnitSpec, options: SwapOptions | None = None) -> SwapResult:
        """Replace unit ``old`` by ``new`` under one lock: see :func:`gpuslate.units.swap.swap`."""
        from .units.swap import swap  # lazy: startup (status needs none of it)

        return swap(self, old, new, options or SwapOptions())

    def restart(self, name: str, options: RestartOptions | None = None) -> RestartResult:
        """Stop a unit and start it with the spec it last ran with: see :func:`gpuslate.units.restart.restart`."""
        from .units.restart import restart  # lazy: startup (status needs none of it)

        return restart(self, name, options or RestartOptions())

    def rm(self, names: Sequence[str]) -> RmResult:
        """Remove the records and logs of units nothing of which runs: see :func:`gpuslate.units.remove.rm`."""
        from .units.remove import rm  # lazy: startup (status needs none of it)

        return rm(self, [names] if isinstance(names, str) else names)

    def ps(self, options: PsOptions | None = None) -> PsResult:
        """Every unit with its live state (``PsOptions(all=False)``: as ``ps`` without ``-a``):
        see :func:`gpuslate.units.listing.list_units`."""
        from .units.listing import list_units  # lazy: startup (status needs none of it)

        return list_units(self, options or PsOptions())

    def audit(self, options: AuditOptions | None = None) -> AuditListing:
        """The newest entries of this host's audit log (``AuditOptions(limit=50)``; 0: all), read
        without opening the backend: see :func:`gpuslate.host.auditlist.list_entries`."""
        from .host.auditlist import list_entries  # lazy: startup (status needs none of it)

        return list_entries(self.audit_for_reading(), options or AuditOptions())

    def logs(self, name: str, options: LogsOptions | None = None) -> LogsResult:
        """Unit ``name``'s last lines (a snapshot; no GPU is needed): see
        :class:`gpuslate.units.logfile.UnitLog`."""
        from .units.logfile import UnitLog  # lazy: startup (status needs none of it)

        return UnitLog(self, name).read(options or LogsOptions())


# -- conveniences: one call, one Host ------------------------------------------------


def status(gpus: Sequence[int] | None = None, *, sim: str | None = None) -> Snapshot:
    """Snapshot of the selected GPUs (all by default) and every process that holds them."""
    with Host.open(sim) as host:
        return host.status(gpus)


def clear(gpus: Sequence[int] | None = None, *, pids: Sequence[int] = (), user: str | None = None,
          match: str | None = None, all_users: bool = False, include_handles: bool = False,
          holders_only: bool = False, grace: float = 10.0, timeout: float = 60.0, max_used: int | None = None,
          dry_run: bool = False, confirm: Callable[[Plan], bool] | None = None, sim: str | None = None,
          backend: GpuBackend | None = None, on_event: Note | None = None) -> ClearResult:
    """``Host.open(sim).clear(Selection(...), ClearOptions(...))`` for one call, with keywords as the CLI's options."""
    sel = Selection(gpus=tuple(gpus) if gpus is not None else None, pids=tuple(pids), user=user, match=match,
                    all_users=all_users, include_handles=include_handles, holders_only=holders_only)
    opts = ClearOptions(grace=grace, timeout=timeout, max_used=max_used, dry_run=dry_run, confirm=confirm)
    with Host.open(sim, backend=backend, on_event=on_event) as host:
        return host.clear(sel, opts)


def wait_free(gpus: Sequence[int] | None = None, *, max_used: int | None = None, timeout: float = 60.0,
              sim: str | None = None, backend: GpuBackend | None = None) -> WaitResult:
    """``Host.open(sim).wait(gpus, WaitOptions(...))`` for one call."""
    with Host.open(sim, backend=backend) as host:
        return host.wait(gpus, WaitOptions(max_used=max_used, timeout=timeout))


if TYPE_CHECKING:
    def _host_has_every_verb(host: Host) -> Verbs:
        """mypy checks :class:`Host` against :class:`~gpuslate.verbs.Verbs` here, structurally."""
        return host
