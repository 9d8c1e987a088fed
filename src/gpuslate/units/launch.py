"""Start a unit's command detached from gpuslate: own session and process group, own
cgroup where possible, stdout and stderr to its log (through the log relay, which records each
line's time: see :mod:`.logfile`), nothing inherited from the caller's terminal.

The command is a child of the ``up`` process only until that exits; being a
session leader with its own stdio, it then lives on under init (or the
nearest subreaper), untouched by the caller's terminal closing or by a
Ctrl-C there.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError
from ..gpu import SIM_VAR, sim_root_from_env
from ..options import Containment
from ..proc.environ import KEEP_ENVIRONMENT
from ..proc.procfs import ProcessId, read_cgroup, read_stat
from . import logfile, store
from .contain import LaunchFence, choose_fence, creating_cgroups, discard_cgroup
from .fence import ID_VAR, NAME_VAR, STATE_VAR
from .spec import UnitSpec

# Popen objects of the units this process started: kept so their exit status
# can be collected (no zombies in a long-lived caller) and no ResourceWarning
# says "still running" when the object would otherwise be collected.
_children: dict[int, subprocess.Popen[bytes]] = {}


@dataclass(frozen=True, kw_only=True, slots=True)
class Launched:
    """A unit's server, just forked; by keywords only (``spawned`` and ``spawned_at`` are both times)."""

    proc: subprocess.Popen[bytes]
    ident: ProcessId
    fence: Containment  # cgroup | scope | session
    cgroup: str | None
    fence_note: str | None  # why a stronger fence was not used
    log: Path
    env: dict[str, str]  # added to the caller's environment
    instance: str  # the unit instance's id (GPUSLATE_UNIT_ID)
    spawned: float  # time.monotonic() right before the fork
    spawned_at: float  # epoch
    relay: subprocess.Popen[bytes] | None = None  # the log relay (None: the unit writes its log itself)


def unit_env(spec: UnitSpec, instance: str, state: str, sim_root: str | None = None) -> dict[str, str]:
    """What the unit's processes get on top of the caller's environment, the markers first (a
    spec's ``env`` cannot forge them; and first in the environment block, where a bounded read
    finds them): ``GPUSLATE_UNIT`` (the name, for a human with /proc), ``GPUSLATE_UNIT_ID``
    (this instance: how ``down`` finds a process that left the session) and
    ``GPUSLATE_UNIT_STATE`` (the state folder, ``state``: a torn record's last clue). Then
    ``SPT_NOENV=1``, which a spec cannot override either: py-setproctitle then renames a worker
    without writing over its environment, so the markers survive ``sglang::scheduler_TP0``
    (:mod:`gpuslate.proc.environ`).

    On a simulated host (``sim_root``), ``GPUSLATE_SIM`` names it, where the caller's environment
    does not already: a library caller's ``Host.open(sim=DIR)`` starts servers that hold their
    simulated memory on that host, as the CLI's ``--sim DIR`` does."""
    env = {NAME_VAR: spec.name, ID_VAR: instance, STATE_VAR: state, **KEEP_ENVIRONMENT}
    named = sim_root_from_env()
    if sim_root is not None and (named is None or os.path.realpath(named) != os.path.realpath(sim_root)):
        env[SIM_VAR] = sim_root
    if spec.gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, spec.gpus))
    env.update((k, v) for k, v in spec.env.items() if k not in env)
    return env


def launch(spec: UnitSpec, units: store.UnitStore, sim_root: str | None = None) -> Launched:
    """Start ``spec.command``, its log in ``units``; raise UsageError if it cannot be executed at all.
    ``sim_root``: the simulated host it starts on (see :func:`unit_env`)."""
    # a collector (this host's or another gpuslate's) leaves the cgroup made here alone until the process is in
    with creating_cgroups():
        fence, note = choose_fence(spec.name, spec.containment)
        if spec.containment not in (Containment.AUTO, Containment.SESSION) and fence.kind != spec.containment:
            raise UsageError(f"containment {str(spec.containment)!r} is not possible on this host: {note}")
        log = units.log_path(spec.name)
        log_fd, times_fd = logfile.open_for_unit(log)
        instance = secrets.token_hex(16)  # 128 bits: no other unit, anywhere, carries it
        added = unit_env(spec, instance, units.mark(), sim_root)
        relayed = None
        try:
            relayed = logfile.start_relay(log_fd, times_fd)
            fd = relayed[1] if relayed is not None else log_fd
            try:
                proc, t_spawn, at = _spawn(spec, fence, fd, added)
            except subprocess.SubprocessError as exc:  # joining the cgroup failed in the child
                discard_cgroup(fence.cgroup)
                if spec.containment == Containment.CGROUP:
                    raise UsageError(f"cannot move the unit into cgroup {fence.cgroup}: {exc}") from None
                note = f"cgroup {fence.cgroup} refused the process"
                fence = LaunchFence(Containment.SESSION, None, [], None)
                proc, t_spawn, at = _spawn(spec, fence, fd, added)
            except BaseException:  # e.g. command not found: the new cgroup must not stay behind
                discard_cgroup(fence.cgroup)
                raise
        finally:
            # the unit's copies are the only writers left: the relay ends when the unit's last one closes
            for own in {log_fd, times_fd, *([relayed[1]] if relayed is not None else [])}:
                os.close(own)
    _children[proc.pid] = proc
    st = read_stat(proc.pid)  # a zombie of ours until reaped, so this always succeeds
    assert st is not None
    cgroup = (fence.cgroup if fence.kind == Containment.CGROUP
              else _scope_cgroup(proc) if fence.kind == Containment.SCOPE else None)
    return Launched(proc=proc, ident=st.ident, fence=fence.kind, cgroup=cgroup, fence_note=note, log=log,
                    env=added, instance=instance, spawned=t_spawn, spawned_at=at,
                    relay=relayed[0] if relayed is not None else None)


def _spawn(spec: UnitSpec, fence: LaunchFence, fd: int, added: dict[str, str],
           ) -> tuple[subprocess.Popen[bytes], float, float]:
    # ours first, then the caller's (without --gpus its CUDA_VISIBLE_DEVICES, if any, stays)
    env = {**added, **{k: v for k, v in os.environ.items() if k not in added}}
    argv = [*fence.argv_prefix, *spec.command]
    t_spawn, at = time.monotonic(), time.time()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, cwd=spec.cwd, env=env,
                                close_fds=True, start_new_session=True, preexec_fn=fence.preexec)
    except FileNotFoundError as exc:
        missing = exc.filename if exc.filename not in (None, spec.cwd) else spec.command[0]
        if spec.cwd and not Path(spec.cwd).is_dir():
            raise UsageError(f"unit {spec.name}: working directory {spec.cwd} does not exist") from None
        raise UsageError(f"unit {spec.name}: command not found: {missing}") from None
    except PermissionError as exc:
        raise UsageError(f"unit {spec.name}: cannot execute {spec.command[0]}: {exc.strerror}") from None
    return proc, t_spawn, at


def _scope_cgroup(proc: subprocess.Popen[bytes]) -> str | None:
    """systemd-run moves itself into the new scope before it execs the command."""
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and proc.poll() is None:
        cg = read_cgroup(proc.pid)
        if cg and cg.endswith(".scope") and "gpuslate-" in cg:
            return cg
        time.sleep(0.002)
    return None


def exit_status(pid: int) -> int | None:
    """Exit code of a unit this process started and that has exited; None otherwise.
    A death by signal N reads as 128 + N, as shells report it."""
    proc = _children.get(pid)
    if proc is None or proc.poll() is None:
        return None
    rc = proc.returncode
    return 128 - rc if rc < 0 else rc
