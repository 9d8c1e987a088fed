"""What GPU daemons hold, and which MPS server each MPS client uses: pure functions of gathered facts.

**A daemon's baseline.** An idle MPS server holds memory on every GPU it serves
(66 MiB on an H200, driver 580; the GPU then reads 74 MiB used) and is listed by
the driver as a compute process, so without a rule no GPU of an MPS host is ever
free and no ``clear`` is ever clean, while ``clear`` itself spares the server. The
memory a *spared* GPU daemon (:mod:`gpuslate.proc.daemons`: a system program
named as one) holds on a GPU is the host's baseline, not a job's: shown apart
("66.0 MiB held by nvidia-cuda-mps-server, spared"), not a holder that keeps the
GPU busy, and not counted against ``--max-used``. The positive fact that widens
"free" is that kernel fact about the program; what is not known never widens it:
a daemon whose memory the driver does not report, or that holds more than
:data:`BASELINE_MAX` on a GPU (an MPS server of a pre-Volta GPU holds its
clients' memory; a daemon doing work), is a holder like any other.

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

from .._parse import format_size

#: the most a spared daemon's baseline is, per daemon and GPU; more is counted as used
BASELINE_MAX = 1 << 30


class DaemonHold(NamedTuple):
    """Memory a spared GPU daemon holds on one GPU: the host's baseline."""

    gpu: int
    pid: int
    program: str
    bytes: int

    def to_json(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> DaemonHold:
        return cls(int(d["gpu"]), int(d["pid"]), str(d["program"]), int(d["bytes"]))

    def describe(self) -> str:
        """``66.0 MiB held by nvidia-cuda-mps-server (PID 42) on GPU 0, spared``"""
        return f"{format_size(self.bytes)} held by {self.program} (PID {self.pid}) on GPU {self.gpu}, spared"


def baseline(gpu: int, processes: Sequence[tuple[int, int | None]], daemons: Mapping[int, str]) -> list[DaemonHold]:
    """The baseline of one GPU: of its listed ``(pid, used memory)``, those of the spared
    daemons ``daemons`` (pid -> program) whose memory is reported and at most
    :data:`BASELINE_MAX` (see the module doc)."""
    return [DaemonHold(gpu, pid, daemons[pid], used) for pid, used in processes
            if pid in daemons and used is not None and 0 <= used <= BASELINE_MAX]


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
