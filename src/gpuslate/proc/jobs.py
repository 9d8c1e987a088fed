"""The job rule: which processes belong together, and which are nobody's job.

``clear`` terminates whole jobs, never single workers of a tensor-parallel
server, and never what the user's session stands on. The rule is stated here
once, as functions of a :class:`ProcessView` (a consistent view of the process
table), and documented word for word in docs/clear.md ("The job rule"):

*Protected* — never a target, never climbed or descended through:
  gpuslate itself and each of its ancestors; PID 1 and kernel threads; init
  systems, subreapers and session infrastructure (``systemd --user``, tini,
  sshd, login, sudo, container shims); terminal multiplexers; interactive
  shells (a shell started without a script or ``-c`` command, a login shell,
  or a shell that leads its session on a terminal). A shell running a script
  (``bash run_server.sh``) or a command (``bash -c ...``) is not protected: it
  belongs to the job it launched.

*Root of a holder's job*: the leader of the holder's process group if it lives
and is not protected; otherwise the highest ancestor of the holder still in
the holder's process group, climbing parent by parent and stopping before a
protected process (at least the holder itself).

*The job of a root*: the root and its descendants; plus, when the root leads
its group, every other member of the group and their descendants; plus, when
the group's leader has exited, the members of the group that hold GPU memory
(workers reparented away from a launcher that exited) and their descendants.
Descent never passes through a protected process, so a program that starts a
holder and clears it never loses its other children.
"""

from __future__ import annotations

from typing import Iterable, Protocol

from .procfs import ProcStat

SHELLS = frozenset({"bash", "sh", "dash", "zsh", "fish", "ksh", "mksh", "tcsh", "csh", "busybox", "ash"})
MULTIPLEXERS = frozenset({"tmux", "tmux: server", "tmux: client", "screen", "SCREEN", "zellij", "byobu"})
#: init systems, subreapers and session infrastructure: where sessions and containers stand
SESSION_DAEMONS = frozenset({
    "systemd", "init", "tini", "dumb-init", "docker-init", "catatonit", "s6-svscan", "s6-supervise",
    "runsv", "runsvdir", "supervisord", "sshd", "sshd-session", "sshd-auth", "login", "su", "sudo",
    "conmon", "runc", "crun", "containerd", "dockerd", "kubelet",
})


class ProcessView(Protocol):
    """A consistent view of the process table (``ProcTable`` reads /proc; tests build one)."""

    def get(self, pid: int) -> ProcStat | None: ...

    def children(self, pid: int) -> list[int]: ...

    def group_members(self, pgid: int) -> list[int]: ...

    def argv(self, pid: int) -> tuple[str, ...]: ...

    def uid(self, pid: int) -> int | None: ...


def is_interactive_shell(st: ProcStat, argv: tuple[str, ...]) -> bool:
    """A shell that reads commands from a person rather than running a script.

    ``bash``, ``-bash`` (login), ``bash -l``, ``zsh -i`` are interactive;
    ``bash run.sh`` and ``bash -c 'cmd'`` are not, unless they lead their
    session on a terminal (then they are someone's login session).
    """
    if st.name not in SHELLS:
        return False
    if st.pid == st.sid and st.tty_nr != 0:
        return True
    if argv and argv[0].startswith("-"):
        return True  # login shell
    operands = [a for a in argv[1:] if not a.startswith(("-", "+"))]
    runs_command = any(a.startswith("-") and not a.startswith("--") and "c" in a[1:] for a in argv[1:])
    return not operands and not runs_command


def static_protection(view: ProcessView, pid: int) -> str | None:
    """Why ``pid`` is protected whoever asks, or None."""
    st = view.get(pid)
    if pid == 1:
        return "PID 1 (init)"
    if st is None:
        return None
    if st.is_kernel_thread:
        return "a kernel thread"
    if st.name in MULTIPLEXERS:
        return f"a terminal multiplexer ({st.name})"
    if st.name in SESSION_DAEMONS or st.name.startswith("containerd-shim"):
        return f"session or container infrastructure ({st.name})"
    if st.name in SHELLS and is_interactive_shell(st, view.argv(pid)):
        return f"an interactive shell ({st.name})"
    return None


class Protection:
    """Protection as seen by one caller: the static rule plus the caller and its ancestors."""

    def __init__(self, view: ProcessView, caller_pid: int | None) -> None:
        self.view = view
        self.caller = caller_pid
        self.caller_line: frozenset[int] = frozenset(
            [caller_pid, *ancestors(view, caller_pid)] if caller_pid is not None else [])
        self._cache: dict[int, str | None] = {}

    def reason(self, pid: int) -> str | None:
        if pid not in self._cache:
            if pid == self.caller:
                why: str | None = "gpuslate itself"
            elif pid in self.caller_line and pid != 1:
                why = "an ancestor of this gpuslate (the shell or session it runs in)"
            else:
                why = static_protection(self.view, pid)
            self._cache[pid] = why
        return self._cache[pid]

    def __call__(self, pid: int) -> bool:
        return self.reason(pid) is not None


def ancestors(view: ProcessView, pid: int) -> list[int]:
    """Parent, grandparent, ... (cycle-safe)."""
    out: list[int] = []
    st = view.get(pid)
    while st is not None and st.ppid > 0 and st.ppid not in out and len(out) < 4096:
        out.append(st.ppid)
        st = view.get(st.ppid)
    return out


def descendants(view: ProcessView, pid: int, protected: Protection) -> list[int]:
    """Every descendant of ``pid``, not descending through protected processes."""
    out: list[int] = []
    seen = {pid}
    stack = [c for c in view.children(pid)]
    while stack:
        p = stack.pop()
        if p in seen or protected(p):
            continue
        seen.add(p)
        out.append(p)
        stack.extend(view.children(p))
    return out


def _alive(st: ProcStat | None) -> bool:
    return st is not None and not st.has_exited


def job_root(view: ProcessView, pid: int, protected: Protection) -> int:
    """The root of ``pid``'s job (see the module doc)."""
    st = view.get(pid)
    if st is None:
        return pid
    leader = view.get(st.pgid)
    if _alive(leader) and not protected(st.pgid):
        return st.pgid
    root = pid
    cur = st
    seen = {pid}
    while cur.ppid > 0 and cur.ppid not in seen:
        parent = view.get(cur.ppid)
        if parent is None or parent.pgid != st.pgid or protected(parent.pid):
            break
        seen.add(parent.pid)
        root, cur = parent.pid, parent
    return root


def job_members(view: ProcessView, root: int, gpu_memory_holders: Iterable[int],
                protected: Protection) -> list[int]:
    """The processes of the job rooted at ``root``, root first, each once."""
    st = view.get(root)
    members = [root]
    if st is None:
        return members
    seeds: list[int] = []
    leader = view.get(st.pgid)
    if st.pgid == root:
        seeds = [m for m in view.group_members(st.pgid) if m != root]
    elif not _alive(leader):
        holders = set(gpu_memory_holders)
        seeds = [m for m in view.group_members(st.pgid) if m != root and m in holders]
    seen = {root}
    for p in [root, *seeds]:
        if p != root:
            if p in seen or protected(p):
                continue
            seen.add(p)
            members.append(p)
        for d in descendants(view, p, protected):
            if d not in seen:
                seen.add(d)
                members.append(d)
    return members
