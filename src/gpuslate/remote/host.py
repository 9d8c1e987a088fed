"""Another host, with the same verbs as :class:`gpuslate.Host`, over ssh.

A :class:`RemoteHost` is to a host reached by ssh what :class:`gpuslate.Host` is
to this one: every verb of :class:`~gpuslate.verbs.Verbs` (``status()``,
``clear(selection, options)``, ``wait(...)``, ``up(spec or name)``, ``down(name)``,
``swap(old, new)``, ``restart(name)``, ``rm(names)``, ``ps()``, ``audit()``,
``logs(name)``), with the same signatures (mypy checks both classes against the
Protocol, at the end of this module), each returning the *same result type* a
local call returns. The wire is the command's versioned
``--json`` document: a verb becomes the ``gpuslate`` command line that asks for
exactly its input and options (built here from the same ``Selection`` and
options objects), runs on the host through the fleet's transport
(:func:`~gpuslate.remote.fleet.run_on_host`: connection sharing, the installed
launcher, named transport failures), and its document is read back with the
result type's ``from_json``. So a result from another host is the same object,
and is rendered by the same function, as one from here.

What cannot cross the wire is refused before anything runs, with a
:class:`~gpuslate.errors.UsageError`: a ``confirm`` callback (a remote clear
cannot ask a person here; plan with ``dry_run`` first, then clear); a unit
spec's explicit ``prefetch`` list (the remote host detects the model's files
itself); a ``swap`` to a spec (NEW goes by name: the remote host resolves it
from its unit file or its last run, as ``gpuslate swap`` does; ``up`` takes a
spec, or a name sent as ``up NAME``, resolved there alike); ``swap``'s prefetch
bounds and ``ps``'s ``recent_s`` (the command takes the host's own); and a
``logs`` ``since`` before 1970 (the command's ``--since`` takes a time).
``status(full=False)`` is accepted and reads the full snapshot: the
command has no lighter reading (``full=False`` only leaves out the
utilization and power a caller does not show), and a full one answers it. A transport failure, or a command that
produced no document, raises the named :class:`~gpuslate.errors.GpuslateError`;
a command that ran and failed (a clear that timed out, a unit that did not come
up) returns its result, whose status says so, as locally.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .._parse import format_gpu_list
from ..clearing.clear import ClearOptions, ClearResult
from ..clearing.plan import Selection
from ..clearing.wait import WaitOptions, WaitResult
from ..errors import UsageError
from ..host.auditlist import AuditListing, AuditOptions, check_limit
from ..host.snapshot import Snapshot
from ..units.lifecycle import DownOptions, DownResult, UpOptions, UpResult
from ..units.listing import PsOptions, PsResult
from ..units.logfile import LogsOptions, LogsResult
from ..units.names import UnitName
from ..units.remove import RmResult
from ..units.restart import RestartOptions, RestartResult
from ..units.spec import UnitSpec
from ..units.swap import SwapOptions, SwapResult
from .fleet import run_on_host
from .hosts import HostSpec, parse_host
from .ssh import SshOptions

if TYPE_CHECKING:
    from ..verbs import Verbs


def _number(v: float) -> str:
    return repr(float(v))


def clear_words(selection: Selection, options: ClearOptions) -> list[str]:
    """The ``clear`` command line that asks for ``selection`` with ``options`` (pure)."""
    if options.confirm is not None:
        raise UsageError("a remote clear cannot ask for confirmation here: plan it with dry_run=True, "
                         "then clear without confirm")
    words = ["clear", "--json", "--yes", "--grace", _number(options.grace), "--timeout", _number(options.timeout)]
    if selection.gpus is not None:
        words += ["--gpus", format_gpu_list(list(selection.gpus))]
    for pid in selection.pids:
        words += ["--pid", str(pid)]
    if selection.user is not None:
        words.append(f"--user={selection.user}")  # '=': a value that starts with '-' stays a value
    if selection.match is not None:
        words.append(f"--match={selection.match}")
    for flag, on in (("--all-users", selection.all_users), ("--include-handles", selection.include_handles),
                     ("--holders-only", selection.holders_only), ("--dry-run", options.dry_run)):
        if on:
            words.append(flag)
    if options.max_used is not None:
        words += ["--max-used", str(options.max_used)]
    return words


def wait_words(gpus: Sequence[int] | None, options: WaitOptions) -> list[str]:
    words = ["wait", "--free", "--json", "--timeout", _number(options.timeout)]
    if gpus is not None:
        words += ["--gpus", format_gpu_list(list(gpus))]
    if options.max_used is not None:
        words += ["--max-used", str(options.max_used)]
    return words


def up_words(spec: UnitSpec, options: UpOptions) -> list[str]:
    """``up NAME [options] -- COMMAND...`` for a whole spec: every field the ``up`` command takes."""
    if spec.prefetch is not None:
        raise UsageError(f"unit {spec.name}: an explicit prefetch list cannot be sent to another host "
                         "(it detects the model's files itself); leave prefetch unset")
    if not spec.command:
        raise UsageError(f"unit {spec.name}: no command")
    words = ["up", spec.name, "--json", f"--ready-host={spec.ready_host}", "--start-timeout",
             _number(spec.start_timeout), "--grace", _number(spec.grace), "--stop-timeout",
             _number(spec.stop_timeout), "--containment", spec.containment]
    optional: tuple[tuple[str, Any], ...] = (
        ("--gpus", format_gpu_list(spec.gpus) if spec.gpus is not None else None), ("--port", spec.port),
        ("--engine", spec.engine), ("--ready", spec.ready_url), ("--ready-log", spec.ready_log),
        ("--model", spec.model), ("--cwd", spec.cwd), ("--max-used", options.max_used), ("--front", spec.front))
    for flag, value in optional:
        if value is not None:
            words.append(f"{flag}={value}")  # '=': a value that starts with '-' stays a value
    for key, value in spec.env.items():
        words.append(f"--env={key}={value}")
    if spec.smoke:
        words.append("--smoke")
    if options.clear_first:
        words.append("--clear")
    return [*words, "--", *spec.command]


def up_name_words(name: str, options: UpOptions) -> list[str]:
    """``up NAME --json [options]``: the unit as the remote host resolves it."""
    words = ["up", UnitName(name), "--json"]
    if options.max_used is not None:
        words.append(f"--max-used={options.max_used}")
    if options.clear_first:
        words.append("--clear")
    return words


def down_words(name: str, options: DownOptions) -> list[str]:
    words = ["down", name, "--json"]
    for flag, value in (("--grace", options.grace), ("--timeout", options.timeout)):
        if value is not None:
            words += [flag, _number(value)]
    if options.max_used is not None:
        words += ["--max-used", str(options.max_used)]
    if options.clear_strays:
        words.append("--clear")
    return words


def swap_words(old: str, new: str | UnitSpec, options: SwapOptions) -> list[str]:
    if not isinstance(new, str):
        raise UsageError(f"a remote swap takes NEW by name, not a spec ({new.name}): the host it runs on "
                         "resolves it from its unit file or the unit's last run, as 'gpuslate swap' does")
    if (options.prefetch_memory, options.prefetch_timeout) != (SwapOptions().prefetch_memory,
                                                               SwapOptions().prefetch_timeout):
        raise UsageError("a remote swap takes the prefetch bounds of the host it runs on: leave "
                         "prefetch_memory and prefetch_timeout unset")
    words = ["swap", old, new, "--json"]
    if options.rollback:
        words.append("--rollback")
    if options.config is not None:
        words.append(f"--config={options.config}")
    if not options.prefetch:
        words.append("--no-prefetch")
    if options.drain_timeout != SwapOptions().drain_timeout:
        words += ["--drain-timeout", _number(options.drain_timeout)]
    return words


def audit_words(options: AuditOptions) -> list[str]:
    """``audit --json --limit N`` (``log ...``: asked for by the command's old name, its old document)."""
    return ["log" if options.old_name else "audit", "--json", "--limit", str(check_limit(options.limit))]


def logs_words(name: str, options: LogsOptions) -> list[str]:
    """``logs NAME --json [--tail N] [--since SECONDS] [--timestamps]``: the snapshot ``options`` asks for."""
    if options.tail is not None and options.tail < 0:
        raise UsageError(f"invalid --tail {options.tail}: must be at least 0")
    words = ["logs", UnitName(name), "--json"]
    if options.tail is not None:
        words += ["--tail", str(options.tail)]
    if options.since is not None:
        if not options.since >= 0:
            raise UsageError(f"a remote logs takes since as a time since 1970 (Unix seconds), not {options.since!r}")
        words += ["--since", f"{options.since:.6f}"]  # Unix seconds: the same moment on either clock
    if options.timestamps:
        words.append("--timestamps")
    return words


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

    def _document(self, words: list[str]) -> dict[str, Any]:
        """Run ``gpuslate WORDS`` there; its document, or the named failure raised."""
        if self.sim is not None:
            words = [*words, "--sim", self.sim]
        outcome = run_on_host(self.spec, words, self.ssh, timeout=self.timeout)
        if outcome.result is None:
            assert outcome.error is not None
            raise outcome.error
        return outcome.result

    def status(self, gpus: Sequence[int] | None = None, *, full: bool = True) -> Snapshot:
        """The snapshot there; ``full=False`` is accepted and reads the full one (the command has no
        lighter reading: see the module docstring)."""
        words = ["status", "--json"] + (["--gpus", format_gpu_list(list(gpus))] if gpus is not None else [])
        return Snapshot.from_json(self._document(words))

    def clear(self, selection: Selection | None = None, options: ClearOptions | None = None) -> ClearResult:
        opts = (options if options is not None else ClearOptions()).validate()
        return ClearResult.from_json(self._document(clear_words(selection or Selection(), opts)))

    def wait(self, gpus: Sequence[int] | None = None, options: WaitOptions | None = None) -> WaitResult:
        opts = (options if options is not None else WaitOptions()).validate()
        return WaitResult.from_json(self._document(wait_words(gpus, opts)))

    def up(self, unit: str | UnitSpec, options: UpOptions | None = None) -> UpResult:
        """``unit``: a spec (sent whole), or a name the remote host resolves from its unit file or
        the unit's last run, as ``gpuslate up NAME`` does there."""
        opts = options or UpOptions()
        if isinstance(unit, str):
            return UpResult.from_json(self._document(up_name_words(unit, opts)))
        return UpResult.from_json(self._document(up_words(unit.validate(), opts)))

    def down(self, name: str, options: DownOptions | None = None) -> DownResult:
        return DownResult.from_json(self._document(down_words(name, options or DownOptions())))

    def swap(self, old: str, new: str | UnitSpec, options: SwapOptions | None = None) -> SwapResult:
        """``new``: the name of a unit the remote host knows (its unit file or a previous ``up``); a
        spec is refused (a UsageError), as it cannot be sent."""
        return SwapResult.from_json(self._document(swap_words(old, new, options or SwapOptions())))

    def restart(self, name: str, options: RestartOptions | None = None) -> RestartResult:
        """Restart unit ``name`` there, as it last ran there."""
        opts = options if options is not None else RestartOptions()
        drain = ([] if opts.drain_timeout == RestartOptions().drain_timeout
                 else ["--drain-timeout", _number(opts.drain_timeout)])
        return RestartResult.from_json(self._document(["restart", UnitName(name), "--json",
                                                       *(["--prefetch"] if opts.prefetch else []), *drain]))

    def rm(self, names: Sequence[str]) -> RmResult:
        """Remove units nothing of which runs there (their records and logs)."""
        wanted = [UnitName(n) for n in ([names] if isinstance(names, str) else names)]
        if not wanted:
            raise UsageError("rm needs the names of the units to remove")
        return RmResult.from_json(self._document(["rm", *wanted, "--json"]))

    def ps(self, options: PsOptions | None = None) -> PsResult:
        opts = options if options is not None else PsOptions()
        if opts.recent_s != PsOptions().recent_s:
            raise UsageError("a remote ps lists by the command's rule (stopped more than an hour ago: "
                             "hidden without all): leave recent_s unset")
        return PsResult.from_json(self._document(["ps", "--json", *(["-a"] if opts.all else [])]))

    def audit(self, options: AuditOptions | None = None) -> AuditListing:
        """The newest entries of the audit log there (its simulated host's, with ``sim``)."""
        return AuditListing.from_json(self._document(audit_words(options or AuditOptions())))

    def logs(self, name: str, options: LogsOptions | None = None) -> LogsResult:
        """Unit ``name``'s last lines there (a snapshot)."""
        return LogsResult.from_json(self._document(logs_words(name, options or LogsOptions())))

    def __enter__(self) -> RemoteHost:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


if TYPE_CHECKING:
    def _remote_host_has_every_verb(host: RemoteHost) -> Verbs:
        """mypy checks :class:`RemoteHost` against :class:`~gpuslate.verbs.Verbs` here, structurally."""
        return host
