"""How a gpuslate command reaches other hosts: one typed Protocol, and its three transports.

    transport = Ssh.select(["gpu1", "gpu2"], None, None, connect_timeout=10)
    result = transport.fan(transport.hosts, ["status", "--json"], on_done=print)

A :class:`Transport` knows its hosts and runs a command's words on some of them, either all at once
(:meth:`~Transport.fan`, bounded) or host by host, stopping at the first that fails
(:meth:`~Transport.roll`: a rolling ``swap`` or ``restart``), reporting each host as it finishes; it
gives a :class:`~gpuslate.remote.fleet.FleetResult` (each host's document or named failure) either way:

- :class:`Ssh`: ``gpuslate WORDS --json`` over ssh on hosts named by ``--host`` or an inventory;
- :class:`Srun`: the same on every node of the Slurm allocation this runs inside, through one ``srun``;
- :class:`~.zipapp.ZipappPush`: ``install``, which runs here: the zipapp built once here, pushed over ssh
  (in zipapp.py, with what it pushes: the other commands need none of it).

cli/fleet.py picks one from the command line and its command's row, fans out through it and
renders; how a host is reached, and what it sent read back, is all here (fleet.py, ssh.py, srun.py,
zipapp.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Protocol

from .._walk import read_file
from ..errors import PermissionDenied, UsageError
from .fleet import DEFAULT_PARALLEL, FleetResult, HostOutcome, run_parallel, run_sequential
from .hosts import HostSpec, select_hosts
from .srun import allocation_from_env, run_allocation
from .ssh import SshOptions

#: called with each host's outcome as it finishes (a progress line)
OnDone = Callable[[HostOutcome], None]

#: an inventory of 10,000 hosts (the most one may hold) is about 0.5 MB
MAX_INVENTORY_BYTES = 8 << 20


class Transport(Protocol):
    """The hosts a command reaches, and how it runs there."""

    @property
    def hosts(self) -> list[HostSpec]:
        """Every host selected, in order."""
        ...

    def fan(self, hosts: Sequence[HostSpec], words: Sequence[str], on_done: OnDone) -> FleetResult:
        """``gpuslate WORDS`` on every one of ``hosts`` at once (as many as the transport allows)."""
        ...

    def roll(self, hosts: Sequence[HostSpec], words: Sequence[str], on_done: OnDone) -> FleetResult:
        """``gpuslate WORDS`` on ``hosts`` one at a time; after a failure the rest are not run, unless
        the transport keeps going."""
        ...


class Ssh:
    """Over ssh (:mod:`.ssh`, :func:`.fleet.run_on_host`): ``parallel`` hosts at a time, each answer
    within ``timeout`` seconds (None: the command's own limits); ``fallback_status``: a host
    without gpuslate is read with nvidia-smi (read-only ``status`` only)."""

    def __init__(self, hosts: Sequence[HostSpec], ssh: SshOptions, *, parallel: int = DEFAULT_PARALLEL,
                 keep_going: bool = False, timeout: float | None = None, fallback_status: bool = False) -> None:
        self._hosts, self.ssh, self.parallel, self.keep_going = list(hosts), ssh, parallel, keep_going
        self.timeout, self.fallback_status = timeout, fallback_status

    @classmethod
    def select(cls, names: Sequence[str], inventory: str | None, group: str | None, *, connect_timeout: float,
               parallel: int = DEFAULT_PARALLEL, keep_going: bool = False, timeout: float | None = None,
               fallback_status: bool = False) -> Ssh:
        """The hosts ``-H`` names and the inventory file ``inventory`` holds (only ``group``'s), with the
        ssh options of the environment (:meth:`~.ssh.SshOptions.from_env`)."""
        text = read_inventory(inventory) if inventory is not None else None
        return cls(select_hosts(names, text, group), SshOptions.from_env(connect_timeout), parallel=parallel,
                   keep_going=keep_going, timeout=timeout, fallback_status=fallback_status)

    @property
    def hosts(self) -> list[HostSpec]:
        return self._hosts

    def fan(self, hosts: Sequence[HostSpec], words: Sequence[str], on_done: OnDone) -> FleetResult:
        return run_parallel(hosts, words, self.ssh, parallel=self.parallel, on_done=on_done,
                            fallback_status=self.fallback_status, timeout=self.timeout)

    def roll(self, hosts: Sequence[HostSpec], words: Sequence[str], on_done: OnDone) -> FleetResult:
        return run_sequential(hosts, words, self.ssh, keep_going=self.keep_going, on_done=on_done,
                              timeout=self.timeout)


class Srun:
    """Through ``srun`` on the nodes of the current Slurm allocation (:mod:`.srun`): all of them in
    one srun, or one srun a node when rolling."""

    def __init__(self, hosts: Sequence[HostSpec], *, keep_going: bool = False, timeout: float | None = None) -> None:
        self._hosts, self.keep_going, self.timeout = list(hosts), keep_going, timeout

    @classmethod
    def from_env(cls, *, keep_going: bool = False, timeout: float | None = None) -> Srun:
        """The allocation ``SLURM_JOB_ID`` and ``SLURM_JOB_NODELIST`` name (a UsageError outside one)."""
        return cls([HostSpec(n) for n in allocation_from_env(os.environ).nodes], keep_going=keep_going,
                   timeout=timeout)

    @property
    def hosts(self) -> list[HostSpec]:
        return self._hosts

    def fan(self, hosts: Sequence[HostSpec], words: Sequence[str], on_done: OnDone) -> FleetResult:
        result = run_allocation(hosts, words, timeout=self.timeout)
        for outcome in result.hosts:
            on_done(outcome)
        return result

    def roll(self, hosts: Sequence[HostSpec], words: Sequence[str], on_done: OnDone) -> FleetResult:
        return run_sequential(hosts, words, SshOptions(), keep_going=self.keep_going, on_done=on_done,
                              run_one=lambda h, w: run_allocation([h], w, timeout=self.timeout).hosts[0])


def read_inventory(path: str) -> str:
    """The inventory file's text, read as the walk reads (gpuslate/_walk.py): a regular file, never
    another user's link, bounded."""
    try:
        return read_file(path, limit=MAX_INVENTORY_BYTES, what="inventory").decode("utf-8")
    except OSError as exc:
        why = exc.strerror if exc.strerror and not isinstance(exc, PermissionDenied) else str(exc)
        raise UsageError(f"cannot read the inventory {path}: {why}") from None
    except UnicodeDecodeError:
        raise UsageError(f"cannot read the inventory {path}: not UTF-8 text") from None
