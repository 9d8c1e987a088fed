"""What GPU daemons hold, and which MPS server each MPS client uses: pure functions of gathered facts.

**A daemon's baseline.** An idle MPS server holds memory on every GPU it serves
(66 MiB on an H200, driver 580, idle and with two clients alike; the GPU then
reads 74 MiB used) and is listed by the driver as a compute process, so without a
rule no GPU of an MPS host is ever free and no ``clear`` is ever clean, while
``clear`` itself spares the server. The memory a spared, *proven* GPU daemon
(:mod:`gpuslate.proc.daemons`: its system program, unchanged, run by root or its
documented user, nothing preloaded, an MPS server started by the control daemon)
holds on a GPU is the host's baseline, not a job's: shown apart ("66.0 MiB held by
nvidia-cuda-mps-server, spared"), not a holder that keeps the GPU busy, and not
counted against ``--max-used``. What is not known never widens "free": a daemon
that is not proven, or whose memory the driver does not report, is a holder like
any other.

**The cap.** However many daemons a GPU lists, together they are allowed at most
:data:`BASELINE_CAP` there (:func:`baseline`, smallest first): anything beyond is
held, like any process's (an MPS server of a pre-Volta GPU holds its clients'
memory; a daemon doing work; a daemon someone made to hold memory). The cap is
256 MiB: about four idle MPS servers as measured on the H200, so two control
daemons' servers on one GPU and a GPU whose context is larger (more SMs, another
driver) still read free, while no daemon, however it was made, can ever have more
than 256 MiB of a GPU (under 0.2 % of an H200's memory) called free.

**MPS clients and their server.** The driver lists MPS clients in
``nvmlDeviceGetMPSComputeRunningProcesses`` (``nvidia-smi`` shows them as
``M+C``: in that list and the compute list; the server as ``C``): kind ``mps``.
The control daemon starts a server with the uid of the client that asks for
one and serves one user at a time, and a server holds a context on every GPU
its clients use; so a client's server is the live MPS server of the client's
uid with a context on each GPU where the client has its MPS context. When
several qualify (two control daemons of one user, each with its own
``CUDA_MPS_PIPE_DIRECTORY``), the pipe folders of the environments decide, and
when they cannot, no server is named: naming is information (the plan says
which clients share a server), never a reason to signal anything.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from .._document import Fields
from .._parse import format_size

#: the most memory spared, proven daemons together may hold on one GPU and have it called the host's
#: baseline (see the module doc: four idle MPS servers as measured on an H200); beyond it, it is held
BASELINE_CAP = 256 << 20


class DaemonHold(NamedTuple):
    """Memory a spared GPU daemon holds on one GPU: the host's baseline."""

    gpu: int
    pid: int
    program: str
    bytes: int

    def to_json(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_json(cls, d: object) -> DaemonHold:
        f = Fields(d)
        return cls(f.gpu("gpu"), f.pid("pid"), f.text("program"), f.size("bytes"))

    def describe(self) -> str:
        """``66.0 MiB held by nvidia-cuda-mps-server (PID 42) on GPU 0, spared``"""
        return f"{format_size(self.bytes)} held by {self.program} (PID {self.pid}) on GPU {self.gpu}, spared"


def baseline(gpu: int, processes: Sequence[tuple[int, int | None]], daemons: Mapping[int, str],
             cap: int = BASELINE_CAP) -> list[DaemonHold]:
    """The baseline of one GPU: of its listed ``(pid, used memory)``, those of the spared, proven
    daemons ``daemons`` (pid -> program) whose memory is reported, smallest first (then by pid),
    as long as together they hold at most ``cap`` (see the module doc). A pid listed twice is
    counted once, with its memory summed. Pure; the result is in pid order."""
    held: dict[int, int | None] = {}
    for pid, used in processes:
        if pid not in daemons:
            continue
        before = held.get(pid, 0)
        held[pid] = None if used is None or before is None else before + used  # unreported once: unknown
    out: list[DaemonHold] = []
    total = 0
    for pid, used in sorted(((p, u) for p, u in held.items() if u is not None and u >= 0),
                            key=lambda pu: (pu[1], pu[0])):
        if total + used > cap:
            break
        total += used
        out.append(DaemonHold(gpu, pid, daemons[pid], used))
    return sorted(out, key=lambda h: h.pid)


class MpsEnd(NamedTuple):
    """What matching needs of an MPS client or server: its uid and where it has its context."""

    uid: int | None
    gpus: frozenset[int]  # a client: where it has an MPS context; a server: where it has any context


def mps_candidates(clients: Mapping[int, MpsEnd], servers: Mapping[int, MpsEnd]) -> dict[int, list[int]]:
    """Client pid -> the servers that may be its own (module doc): of its uid, with a context on
    each GPU where the client has its context. A client of unknown uid or no GPU has none."""
    out: dict[int, list[int]] = {}
    for pid, c in clients.items():
        if c.uid is None or not c.gpus:
            continue
        found = [s for s, e in sorted(servers.items()) if s != pid and e.uid == c.uid and c.gpus <= e.gpus]
        if found:
            out[pid] = found
    return out


def mps_servers(candidates: Mapping[int, list[int]], pipes: Mapping[int, str | None]) -> dict[int, int]:
    """Client pid -> its server's pid, for the clients whose server can be told: the one candidate,
    or of several the one whose MPS pipe folder (``pipes``: absent or ``None``, unknown) is the
    client's; only a match of two known folders chooses."""
    out: dict[int, int] = {}
    for client, found in candidates.items():
        if len(found) > 1:
            mine = pipes.get(client)
            found = [s for s in found if mine is not None and pipes.get(s) == mine]
        if len(found) == 1:
            out[client] = found[0]
    return out


def mps_possible(clients: Mapping[int, MpsEnd], servers: Mapping[int, MpsEnd],
                 pipes: Mapping[int, str | None]) -> dict[int, tuple[int, ...]]:
    """Client pid -> every server it could be a client of (module doc): each server but those a
    known fact rules out: another uid (both known), no GPU in common (the client's GPUs known),
    two pipe folders both known and different (``pipes``: absent or ``None``, unknown). Unknown
    never rules a server out. Pure."""
    out: dict[int, tuple[int, ...]] = {}
    for pid, c in clients.items():
        mine = pipes.get(pid)
        found = tuple(s for s, e in sorted(servers.items())
                      if s != pid
                      and (c.uid is None or e.uid is None or c.uid == e.uid)
                      and (not c.gpus or not e.gpus or bool(c.gpus & e.gpus))
                      and (mine is None or pipes.get(s) is None or pipes.get(s) == mine))
        if found:
            out[pid] = found
    return out


def sharing(servers: Mapping[int, int]) -> dict[int, list[int]]:
    """Server pid -> its clients, from :func:`mps_servers`'s answer."""
    out: dict[int, list[int]] = {}
    for client, server in sorted(servers.items()):
        out.setdefault(server, []).append(client)
    return out
