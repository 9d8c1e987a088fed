"""Process trees: who launched a GPU holder, and what belongs to its job.

The launcher of a job (``root_pid``) is the leader of the holder's process
group while it lives (this finds workers that double-forked away from their
launcher, like SGLang schedulers reparented to PID 1), else the highest
ancestor still in that group. The climb never crosses a *boundary*: PID 1, a
kernel thread, a shell, a terminal multiplexer, sshd, or a container shim:
those are where a user's session is, not part of the job.
"""

from __future__ import annotations

from .procfs import ProcStat, list_pids, read_stat

SHELLS = frozenset({"bash", "sh", "dash", "zsh", "fish", "ksh", "mksh", "tcsh", "csh", "busybox"})
MULTIPLEXERS = frozenset({"tmux", "tmux: server", "tmux: client", "screen", "SCREEN", "zellij", "byobu"})
SESSION_DAEMONS = frozenset({
    "sshd", "sshd-session", "sshd-auth", "login", "su", "sudo", "systemd", "init",
    "tini", "dumb-init", "docker-init", "conmon", "runc", "crun",
})


def is_boundary(st: ProcStat) -> bool:
    """True for processes that end a climb towards a job's launcher."""
    return (
        st.pid <= 1
        or st.is_kernel_thread
        or st.name in SHELLS
        or st.name in MULTIPLEXERS
        or st.name in SESSION_DAEMONS
        or st.name.startswith("containerd-shim")
    )


class ProcTable:
    """A lazily filled view of the host's processes for one decision.

    Reads each ``/proc/PID/stat`` at most once; the full table (needed to
    find descendants) is only built when asked for.
    """

    def __init__(self) -> None:
        self._stats: dict[int, ProcStat | None] = {}
        self._children: dict[int, list[int]] | None = None
        self._complete = False

    def get(self, pid: int) -> ProcStat | None:
        if pid not in self._stats:
            if self._complete:
                return None
            self._stats[pid] = read_stat(pid)
        return self._stats[pid]

    def load_all(self) -> None:
        if self._complete:
            return
        for pid in list_pids():
            if pid not in self._stats:
                self._stats[pid] = read_stat(pid)
        self._complete = True

    def all(self) -> list[ProcStat]:
        self.load_all()
        return [st for st in self._stats.values() if st is not None]

    def children(self, pid: int) -> list[int]:
        if self._children is None:
            kids: dict[int, list[int]] = {}
            for st in self.all():
                kids.setdefault(st.ppid, []).append(st.pid)
            self._children = kids
        return self._children.get(pid, [])

    def descendants(self, pid: int) -> list[int]:
        out: list[int] = []
        stack = list(self.children(pid))
        while stack:
            p = stack.pop()
            out.append(p)
            stack.extend(self.children(p))
        return out

    def ancestors(self, pid: int) -> list[int]:
        """Parent, grandparent, ... up to PID 1 (cycle-safe)."""
        out: list[int] = []
        st = self.get(pid)
        while st is not None and st.ppid > 0 and st.ppid not in out and len(out) < 4096:
            out.append(st.ppid)
            st = self.get(st.ppid)
        return out

    def group_members(self, pgid: int) -> list[int]:
        return [st.pid for st in self.all() if st.pgid == pgid]

    def root_pid(self, pid: int) -> int:
        """The launcher of the job that ``pid`` belongs to (see module doc)."""
        st = self.get(pid)
        if st is None:
            return pid
        leader = self.get(st.pgid)
        if leader is not None and leader.state not in ("Z", "X") and not is_boundary(leader):
            return leader.pid
        return self.climb_in_group(pid)[-1]

    def climb_in_group(self, pid: int) -> list[int]:
        """``pid`` and its ancestors while they stay in its process group, short of a boundary."""
        chain = [pid]
        st = self.get(pid)
        if st is None:
            return chain
        cur = st
        while True:
            parent = self.get(cur.ppid) if cur.ppid > 0 else None
            if parent is None or parent.pgid != st.pgid or is_boundary(parent) or parent.pid in chain:
                return chain
            chain.append(parent.pid)
            cur = parent
