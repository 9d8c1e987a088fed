"""One renderer per result type, for a local run and for another host's document alike.

A command's ``--json`` document is the contract: a local result is shown as its document gives
it back (:func:`as_sent`), and a remote host's document is read back into the same result type
(``from_json``) and shown by the same function (:func:`show_document`). So a command prints the
same bytes here and over ``--host``; only the fleet's heading and summary are added around it.

The renderers are imported when a document is shown: ``status`` never loads rich.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar


class Result(Protocol):
    """What every command result is: a versioned document, and read back from one."""

    def to_json(self) -> dict[str, Any]: ...


R = TypeVar("R", bound=Result)


def as_sent(result: R) -> R:
    """``result`` as its document carries it: what a remote host's renderer would get."""
    return type(result).from_json(result.to_json())  # type: ignore[attr-defined]


T = TypeVar("T")


class Kind(Generic[T]):
    """A result type by its document: how to read it back, and its renderer.

    A plain class, not a dataclass: ``dataclasses`` (with inspect, ast, dis...) costs every
    ``clear`` about 10 ms at start, and this module is on its path."""

    __slots__ = ("read", "show")

    def __init__(self, read: Callable[[object], T], show: Callable[[T], None]) -> None:
        self.read = read
        self.show = show

    def show_document(self, doc: object) -> None:
        self.show(self.read(doc))


def _status() -> Kind[Any]:
    from ...host.snapshot import Snapshot  # lazy: startup
    from .status import print_status  # lazy: startup

    return Kind(Snapshot.from_json, lambda snap: print_status(snap))


def _clear() -> Kind[Any]:
    from ...slate.clear import ClearResult  # lazy: startup
    from .clear import print_clear  # lazy: startup

    return Kind(ClearResult.from_json, print_clear)


def _wait() -> Kind[Any]:
    from ...slate.wait import WaitResult  # lazy: startup
    from .clear import print_wait  # lazy: startup

    return Kind(WaitResult.from_json, print_wait)


def _units(name: str) -> Kind[Any]:
    from ...units.batch import BatchResult  # lazy: startup
    from ...units.lifecycle import DownResult, UpResult  # lazy: startup
    from ...units.listing import PsResult  # lazy: startup
    from ...units.remove import RmResult  # lazy: startup
    from ...units.restart import RestartResult  # lazy: startup
    from ...units.swap import SwapResult  # lazy: startup
    from . import units as r  # lazy: startup

    kinds: dict[str, Kind[Any]] = {
        "up": Kind(UpResult.from_json, r.show_up), "down": Kind(DownResult.from_json, r.show_down),
        "swap": Kind(SwapResult.from_json, r.show_swap), "ps": Kind(PsResult.from_json, r.show_ps),
        "restart": Kind(RestartResult.from_json, r.show_restart), "rm": Kind(RmResult.from_json, r.show_rm),
        "batch": Kind(BatchResult.from_json, r.show_batch)}
    return kinds[name]


def _audit() -> Kind[Any]:
    from ...host.audit import AuditListing  # lazy: startup
    from .audit import print_log  # lazy: startup

    return Kind(AuditListing.from_json, print_log)


def _sim_init() -> Kind[Any]:
    from ...gpu.sim.results import SimInitResult  # lazy: startup
    from .sim import show_init  # lazy: startup

    return Kind(SimInitResult.from_json, show_init)


def _sim_leak() -> Kind[Any]:
    from ...gpu.sim.results import SimLeakResult  # lazy: startup
    from .sim import show_leak  # lazy: startup

    return Kind(SimLeakResult.from_json, show_leak)


def _install() -> Kind[Any]:
    from ...remote.zipapp import InstallResult  # lazy: startup
    from .install import show_install  # lazy: startup

    return Kind(InstallResult.from_json, show_install)


def _bench() -> Kind[Any]:
    from ...bench.result import BenchResult  # lazy: startup
    from .bench import print_bench  # lazy: startup

    return Kind(BenchResult.from_json, print_bench)


def _experiment() -> Kind[Any]:
    from ...bench.report import Report  # lazy: startup
    from .experiment import print_report  # lazy: startup

    return Kind(Report.from_json, print_report)


def _slurm() -> Kind[Any]:
    from ...slurm.hooks import HookResult  # lazy: startup
    from .slurm import show_hook  # lazy: startup

    return Kind(HookResult.from_json, show_hook)


def _demo() -> Kind[Any]:
    from ...bench.report import DemoResult  # lazy: startup
    from .experiment import show_demo  # lazy: startup

    return Kind(DemoResult.from_json, show_demo)


def _logs() -> Kind[Any]:
    from ...units.logfile import LogsResult  # lazy: startup
    from .logs import show_logs  # lazy: startup

    return Kind(LogsResult.from_json, show_logs)


_KINDS: dict[str, Callable[[], Kind[Any]]] = {
    "status": _status, "clear": _clear, "wait": _wait, "audit": _audit, "log": _audit,
    "sim.init": _sim_init, "sim.leak": _sim_leak, "install": _install, "bench": _bench, "experiment": _experiment,
    "slurm": _slurm, "demo": _demo, "logs": _logs,
    **{name: (lambda n=name: _units(n)) for name in ("up", "down", "swap", "ps", "restart", "rm",  # type: ignore[misc]
                                                    "batch")},
}


def kind_of(schema: object) -> Kind[Any] | None:
    """The result type of a ``gpuslate.NAME.v1`` document; None for one without a renderer."""
    if not isinstance(schema, str) or not schema.startswith("gpuslate."):
        return None
    make = _KINDS.get(schema.removeprefix("gpuslate.").rsplit(".v", 1)[0])
    return make() if make is not None else None


def show_document(doc: dict[str, Any]) -> bool:
    """Show a command's document as the command shows its result; False when it has no renderer."""
    kind = kind_of(doc.get("schema"))
    if kind is None:
        return False
    kind.show_document(doc)
    return True
