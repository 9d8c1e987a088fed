"""A forest of processes as data: generated from a seed, started by :mod:`fuzzkit.node`.

Generation is a pure function of the seed (``random.Random(seed)``), so a failing forest replays
from its seed alone. The shapes are the ones issue 15 names: groups and sessions made and left,
leaders that exit, double forks, signal forwarders (a Python parent that forwards SIGTERM, and the
real ``runuser`` and ``su``), ``setpriv`` to a second user, nested PID namespaces (``unshare --fork --pid``),
handle-only monitors, GPU-memory holders on random simulated GPUs, processes renamed to ``sshd``,
``bash``, ``tini``, ``systemd``, handlers that ignore SIGTERM, never exit on it, or fork on it,
stopped processes (an orphaned stopped group gets SIGHUP) and session leaders on a terminal (their
exit hangs it up: SIGHUP to its foreground group).

Since issue 24, drawn from a second stream (:func:`_overlay`, so that a seed keeps the shape it had):
renamed the ways real servers rename (py-setproctitle, which moves the environment for a long
title; the same with ``SPT_NOENV``; ``prctl(PR_SET_NAME)`` alone; argv[0] set at exec, bash's
``exec -a``), a main thread that exits while another thread keeps the process (``/proc`` says Z
for it), a holder that starts late, and an MPS-like pair: a control daemon and a server that *are*
the programs ``nvidia-cuda-mps-control``/``nvidia-cuda-mps-server`` (``/proc/PID/exe``, root's),
the server holding a footprint on GPUs its clients (other holders) hold too.

Since issue 32, from the same second stream, after what it drew before (a seed keeps its forest and
gains these): the clients hold MPS contexts on the server's GPUs (kind ``mps``, as the driver lists
them), renamed as any node is (setproctitle writes its title over the environment: the pipe folder
is then unknown); and hostile daemon look-alikes, which run the MPS server's very program but are
not the daemon: one started by no control daemon (``orphan``), one with ``LD_PRELOAD`` under a
control daemon (``preload``), each holding memory a clear must never call the host's baseline.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

GPUS = 4
MiB = 1024**2
#: titles a process can give itself that name-based protection used to trust
PROTECTED_TITLES = ("sshd", "bash", "tini", "systemd", "sudo", "tmux: server", "login")
OTHER_TITLES = ("sglang::scheduler_TP0", "vllm serve", "runuser", "python3")


class Start(str, Enum):
    """How a node's parent starts it."""

    FORK = "fork"  # os.fork(): same user, same group unless the node changes it
    DOUBLE_FORK = "double_fork"  # fork, fork, the middle exits: reparented to the namespace's init
    AS_OTHER = "as_other"  # fork, then setgid/setuid to the second user
    RUNUSER = "runuser"  # exec `runuser -u OTHER -- python node.py`: runuser stays as a forwarding parent
    SU = "su"  # exec `su -s /bin/sh OTHER -c 'exec python node.py'`: su stays as a forwarding parent
    SETPRIV = "setpriv"  # exec `setpriv --reuid OTHER -- python node.py`: no extra process
    UNSHARE = "unshare"  # exec `unshare --fork --pid python node.py`: the node is the new namespace's init
    DAEMON = "daemon"  # exec the program ``NodeSpec.program`` (a system copy of this interpreter) with node.py


class Group(str, Enum):
    INHERIT = "inherit"
    SETSID = "setsid"  # a session (and group) of its own
    SETPGID = "setpgid"  # a group of its own, same session


class Term(str, Enum):
    """What the node does on SIGTERM."""

    DEFAULT = "default"  # dies
    IGNORE = "ignore"  # SIG_IGN (visible in SigIgn)
    FORWARD = "forward"  # sends SIGTERM to its children, waits for them, exits (like runuser, su)
    STAY = "stay"  # a handler that never exits (a server stuck in shutdown): only SIGKILL ends it
    FORK = "fork"  # a shutdown hook: forks a helper, waits for it, exits


class Rename(str, Enum):
    """How a node gives itself its title."""

    SPT = "setproctitle"  # argv and comm; a title longer than argv's room moves the environment
    SPT_NOENV = "setproctitle_noenv"  # SPT_NOENV=1 first: the environment stays, the title fits argv's room
    PRCTL = "prctl"  # prctl(PR_SET_NAME): the kernel's 15-character name only, argv untouched
    EXEC_A = "exec_a"  # exec'd with argv[0] = the title (bash's ``exec -a``): its name is its program's


#: starts that need the second user
NEEDS_OTHER = (Start.AS_OTHER, Start.RUNUSER, Start.SU, Start.SETPRIV)
#: the programs of the MPS-like pair (GPU daemons by what they run: spared unless --include-handles)
MPS_CONTROL, MPS_SERVER = "nvidia-cuda-mps-control", "nvidia-cuda-mps-server"


@dataclass
class NodeSpec:
    id: str
    parent: str | None
    start: Start
    group: Group
    term: Term
    hold: list[tuple[int, int]] = field(default_factory=list)  # (gpu, bytes) of GPU memory
    handles: list[int] = field(default_factory=list)  # GPUs held open without memory (a monitor)
    exits: bool = False  # exits once its children are up (a leader that exits)
    title: str | None = None
    children: list[str] = field(default_factory=list)
    stopped: bool = False  # SIGSTOPped by the driver once up: a group a target's exit may orphan gets SIGHUP
    tty: bool = False  # leads its session on a terminal of its own (a pty): its exit hangs the terminal up
    other: bool = False  # runs as the second user
    nsdepth: int = 0  # nesting of PID namespaces below the fuzzer's
    rename: Rename = Rename.SPT
    main_exits: bool = False  # once up, its main thread exits (pthread_exit) and a second thread keeps it
    delay_ms: int = 0  # starts late: sleeps this long before it holds and reports (a loaded machine)
    program: str | None = None  # Start.DAEMON: the program it runs (MPS_CONTROL, MPS_SERVER)
    mps_gpus: list[int] = field(default_factory=list)  # where its holds are MPS contexts (an MPS client)
    preload: bool = False  # Start.DAEMON: exec'd with LD_PRELOAD (a system library) in its environment
    hostile: str | None = None  # a daemon look-alike, how: orphan (no control daemon started it), preload

    @property
    def display_title(self) -> str:
        return self.title if self.title is not None else f"fuzz-{self.id}"

    @property
    def wrapper(self) -> str | None:
        """The program that stays as this node's parent (``runuser``, ``unshare``), if any."""
        return {Start.RUNUSER: "runuser", Start.SU: "su", Start.UNSHARE: "unshare"}.get(self.start)


@dataclass
class Forest:
    seed: int
    nodes: dict[str, NodeSpec]
    roots: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "roots": self.roots,
                "nodes": {k: {**asdict(v), "start": v.start.value, "group": v.group.value, "term": v.term.value,
                              "rename": v.rename.value}
                          for k, v in self.nodes.items()}}



def _pick(rng: random.Random, weights: dict[Any, int]) -> Any:
    keys = list(weights)
    return rng.choices(keys, [weights[k] for k in keys])[0]


def generate(seed: int, *, other_user: bool = True, max_nodes: int = 9) -> Forest:
    """A random forest; ``other_user`` False leaves out every shape that needs a second user."""
    rng = random.Random(seed)
    nodes: dict[str, NodeSpec] = {}
    roots: list[str] = []

    def make(parent: NodeSpec | None, depth: int) -> str:
        nid = f"n{len(nodes)}"
        starts = {Start.FORK: 50, Start.DOUBLE_FORK: 10, Start.UNSHARE: 5}
        if other_user and not (parent and parent.other):
            starts.update({Start.AS_OTHER: 10, Start.RUNUSER: 4, Start.SU: 2, Start.SETPRIV: 3})
        if parent and (parent.nsdepth >= 2 or parent.other):  # unshare needs root
            del starts[Start.UNSHARE]
        start = _pick(rng, starts)
        group = _pick(rng, {Group.INHERIT: 60, Group.SETSID: 20, Group.SETPGID: 20})
        node = NodeSpec(nid, parent.id if parent else None, start, group, Term.DEFAULT,
                        other=(parent is not None and parent.other) or start in NEEDS_OTHER,
                        nsdepth=(parent.nsdepth if parent else 0) + (start == Start.UNSHARE))
        nodes[nid] = node
        r = rng.random()
        if r < 0.45:
            gpus = sorted(rng.sample(range(GPUS), rng.randint(1, 2)))
            node.hold = [(g, rng.choice((256, 1024, 4096)) * MiB) for g in gpus]
        elif r < 0.6:
            node.handles = sorted(rng.sample(range(GPUS), rng.randint(1, 2)))
        if rng.random() < 0.18:
            node.title = rng.choice(PROTECTED_TITLES + OTHER_TITLES)
        if depth < 3:
            for _ in range(rng.choices((0, 1, 2, 3), (35, 35, 20, 10))[0]):
                if len(nodes) >= max_nodes:
                    break
                node.children.append(make(node, depth + 1))
        terms = {Term.DEFAULT: 60, Term.IGNORE: 8, Term.STAY: 4, Term.FORK: 8}
        if node.children:
            terms[Term.FORWARD] = 25
        node.term = _pick(rng, terms)
        # a leader that exits once its children run (never a namespace's init: that ends the namespace)
        node.exits = bool(node.children) and start != Start.UNSHARE and rng.random() < 0.15
        node.stopped = not node.exits and start != Start.UNSHARE and rng.random() < 0.06  # init cannot stop itself
        node.tty = group == Group.SETSID and bool(node.children) and not node.exits and rng.random() < 0.3
        return nid

    for _ in range(rng.randint(1, 3)):
        if len(nodes) < max_nodes:
            roots.append(make(None, 0))
    _overlay(random.Random(seed * 104729 + 24), nodes, roots)
    return Forest(seed, nodes, roots)


def _overlay(rng: random.Random, nodes: dict[str, NodeSpec], roots: list[str]) -> None:
    """The shapes of issue 24, drawn from their own stream over a forest already made."""
    for node in list(nodes.values()):
        renames = {Rename.SPT: 60, Rename.SPT_NOENV: 22, Rename.PRCTL: 15}
        if node.start in (Start.FORK, Start.DOUBLE_FORK, Start.AS_OTHER):  # a start that can exec (costly)
            renames[Rename.EXEC_A] = 3
        node.rename = _pick(rng, renames)
        # a leader that exits entirely already leaves its children; a thread outliving it is another shape
        node.main_exits = not node.exits and rng.random() < 0.1
        node.delay_ms = rng.randint(5, 30) if rng.random() < 0.05 else 0
    if rng.random() < 0.08:  # an MPS-like pair with its clients (two exec'd interpreters: costly)
        gpus = sorted(rng.sample(range(GPUS), rng.randint(1, 2)))
        control = NodeSpec(f"n{len(nodes)}", None, Start.DAEMON, Group.SETSID, Term.DEFAULT, handles=gpus,
                           program=MPS_CONTROL)
        nodes[control.id] = control
        server = NodeSpec(f"n{len(nodes)}", control.id, Start.DAEMON, Group.INHERIT, Term.DEFAULT,
                          hold=[(g, 64 * MiB) for g in gpus], program=MPS_SERVER,
                          main_exits=rng.random() < 0.2)
        nodes[server.id] = server
        control.children.append(server.id)
        roots.append(control.id)
        # clients: processes of the fuzzer's user holding memory on the server's GPUs, wherever they are
        # TODO(issue 24, MPS): with the MPS branch, these are the server's clients (kind mps, its pid) and
        # the invariant grows: a server whose clients are not all targets is never signaled
        candidates = sorted((n for n in nodes.values() if n.hold and not n.other and n.program is None),
                            key=lambda n: n.id)
        for client in rng.sample(candidates, min(len(candidates), rng.randint(1, 2))):
            held = {g for g, _ in client.hold}
            client.hold += [(g, 256 * MiB) for g in gpus if g not in held]
            client.mps_gpus = list(gpus)  # its contexts there are MPS ones (issue 32)
    if rng.random() < 0.1:  # a daemon look-alike (issue 32): the server's program, not the daemon
        how = rng.choice(("orphan", "preload"))
        gpus = sorted(rng.sample(range(GPUS), rng.randint(1, 2)))
        parent = None
        if how == "preload":
            parent = NodeSpec(f"n{len(nodes)}", None, Start.DAEMON, Group.SETSID, Term.DEFAULT, handles=gpus,
                              program=MPS_CONTROL)
            nodes[parent.id] = parent
            roots.append(parent.id)
        fake = NodeSpec(f"n{len(nodes)}", parent.id if parent else None, Start.DAEMON,
                        Group.INHERIT if parent else Group.SETSID, Term.DEFAULT,
                        hold=[(g, rng.choice((64, 200)) * MiB) for g in gpus], program=MPS_SERVER,
                        preload=how == "preload", hostile=how)
        nodes[fake.id] = fake
        if parent is not None:
            parent.children.append(fake.id)
        else:
            roots.append(fake.id)
