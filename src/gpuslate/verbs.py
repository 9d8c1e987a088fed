"""The verbs of a host, as one typed Protocol: what :class:`gpuslate.Host` (this host) and
:class:`gpuslate.RemoteHost` (another, over ssh) both are.

    def drain(host: Verbs, name: str) -> DownResult:
        return host.down(name, DownOptions(clear_strays=True))

runs here or there alike, and a type checker holds both classes to these
signatures: mypy checks each against :class:`Verbs` structurally (api.py and
remote/host.py say so where they define them), so a verb added to one class,
or typed differently on one, fails the type check, not a user.

Why a module of its own: ``api`` (the local host) sits above ``clearing/`` and
``units/``, and ``remote/`` beside it; a Protocol both can import without an
upward import or a cycle is one that imports neither. Every type below is
imported only for the type checker, so importing this module costs nothing at
run time (``gpuslate status`` loads it and must stay light).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .clearing.clear import ClearOptions, ClearResult
    from .clearing.plan import Selection
    from .clearing.wait import WaitOptions, WaitResult
    from .host.auditlist import AuditListing, AuditOptions
    from .host.snapshot import Snapshot
    from .units.lifecycle import DownOptions, DownResult, UpOptions, UpResult
    from .units.listing import PsOptions, PsResult
    from .units.logfile import LogsOptions, LogsResult
    from .units.remove import RmResult
    from .units.restart import RestartOptions, RestartResult
    from .units.spec import UnitSpec
    from .units.swap import SwapOptions, SwapResult


class Verbs(Protocol):
    """Every verb of a host: its input first, a small frozen options object last (None: the
    defaults), a result value with ``to_json()`` and a status back."""

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

    def logs(self, name: str, options: LogsOptions | None = None) -> LogsResult:
        """A unit's last lines (a snapshot)."""
        ...
