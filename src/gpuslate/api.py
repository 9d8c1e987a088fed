"""The public way in: :class:`Host`, the context of every operation, with the verbs as its methods.

    with gpuslate.Host.open(sim="/tmp/h") as host:
        snap = host.status()
        result = host.clear(Selection(gpus=(0,)), ClearOptions(grace=5))

Why here and not in ``host/``: the context (backend, lock, audit log, state
folder, event sink) is :class:`~gpuslate.host.session.HostContext`, which
``slate/`` and ``units/`` import to do their work; the verbs are implemented
in those packages, so the facade that calls them must sit above both, or the
import graph would loop (host -> units -> host).

Why the verbs' modules are loaded through :data:`_VERBS`: ``gpuslate status``
must not pay, at every start, for the modules of ``clear`` or ``up``. The
table below is the one place where that laziness lives (as ``__init__``'s
PEP 562 table is for the package's names); ``status`` needs nothing more
than the snapshot module imported here.

A composite verb (``swap``; ``up`` with ``clear_first``; ``down`` with
``clear_strays``) calls its siblings on the same context: one backend, one
audit log, and the host lock taken once (re-entrant), with no ``lock=`` flag.

``status()``, ``clear()`` and ``wait_free()`` at the bottom are conveniences
for one call with keyword arguments (re-exported by ``gpuslate``); each opens
a :class:`Host` for that call and goes through it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from .gpu import GpuBackend
from .host.session import HostContext, Note, ProgressSink
from .host.snapshot import Snapshot, take_snapshot

if TYPE_CHECKING:
    from .slate.clear import ClearOptions, ClearResult
    from .slate.plan import Plan, Selection
    from .slate.wait import WaitOptions, WaitResult
    from .units.lifecycle import DownOptions, DownResult, UpOptions, UpResult
    from .units.listing import PsOptions, PsResult
    from .units.remove import RmResult
    from .units.restart import RestartOptions, RestartResult
    from .units.spec import UnitSpec
    from .units.swap import SwapOptions, SwapResult

#: verb -> the module that implements it, imported on the verb's first call
#: ("selection": the module of :class:`~gpuslate.slate.plan.Selection`, clear's input)
_VERBS = {
    "clear": "gpuslate.slate.clear", "wait": "gpuslate.slate.wait", "selection": "gpuslate.slate.plan",
    "up": "gpuslate.units.lifecycle", "down": "gpuslate.units.lifecycle", "swap": "gpuslate.units.swap",
    "ps": "gpuslate.units.listing", "restart": "gpuslate.units.restart", "rm": "gpuslate.units.remove",
}


def _verb(name: str) -> ModuleType:
    """The module of verb ``name`` (see the module docstring for why it is loaded late)."""
    return importlib.import_module(_VERBS[name])


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
        """Plan, act, verify: see :func:`gpuslate.slate.clear.clear`."""
        mod = _verb("clear")
        sel = selection if selection is not None else _verb("selection").Selection()
        result: ClearResult = mod.clear(self, sel, options if options is not None else mod.ClearOptions())
        return result

    def wait(self, gpus: Sequence[int] | None = None, options: WaitOptions | None = None) -> WaitResult:
        """Wait until the GPUs are free; signals nothing: see :func:`gpuslate.slate.wait.wait_free`."""
        mod = _verb("wait")
        result: WaitResult = mod.wait_free(self, gpus, options if options is not None else mod.WaitOptions())
        return result

    def up(self, spec: UnitSpec, options: UpOptions | None = None) -> UpResult:
        """Start a unit, return once it serves: see :func:`gpuslate.units.lifecycle.up`."""
        mod = _verb("up")
        result: UpResult = mod.up(self, spec, options if options is not None else mod.UpOptions())
        return result

    def down(self, name: str, options: DownOptions | None = None) -> DownResult:
        """Stop a unit, verify its GPUs: see :func:`gpuslate.units.lifecycle.down`."""
        mod = _verb("down")
        result: DownResult = mod.down(self, name, options if options is not None else mod.DownOptions())
        return result

    def swap(self, old: str, new: str | UnitSpec, options: SwapOptions | None = None) -> SwapResult:
        """Replace unit ``old`` by ``new`` under one lock: see :func:`gpuslate.units.swap.swap`."""
        mod = _verb("swap")
        result: SwapResult = mod.swap(self, old, new, options if options is not None else mod.SwapOptions())
        return result

    def restart(self, name: str, options: RestartOptions | None = None) -> RestartResult:
        """Stop a unit and start it with the spec it last ran with: see :func:`gpuslate.units.restart.restart`."""
        mod = _verb("restart")
        result: RestartResult = mod.restart(self, name, options if options is not None else mod.RestartOptions())
        return result

    def rm(self, names: Sequence[str]) -> RmResult:
        """Remove the records and logs of units nothing of which runs: see :func:`gpuslate.units.remove.rm`."""
        result: RmResult = _verb("rm").rm(self, [names] if isinstance(names, str) else names)
        return result

    def ps(self, options: PsOptions | None = None) -> PsResult:
        """Every unit with its live state (``PsOptions(all=False)``: as ``ps`` without ``-a``):
        see :func:`gpuslate.units.listing.list_units`."""
        mod = _verb("ps")
        result: PsResult = mod.list_units(self, options if options is not None else mod.PsOptions())
        return result


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
    sel = _verb("selection").Selection(tuple(gpus) if gpus is not None else None, tuple(pids), user, match,
                                       all_users, include_handles, holders_only)
    opts = _verb("clear").ClearOptions(grace, timeout, max_used, dry_run, confirm)
    with Host.open(sim, backend=backend, on_event=on_event) as host:
        return host.clear(sel, opts)


def wait_free(gpus: Sequence[int] | None = None, *, max_used: int | None = None, timeout: float = 60.0,
              sim: str | None = None, backend: GpuBackend | None = None) -> WaitResult:
    """``Host.open(sim).wait(gpus, WaitOptions(...))`` for one call."""
    with Host.open(sim, backend=backend) as host:
        return host.wait(gpus, _verb("wait").WaitOptions(max_used, timeout))
