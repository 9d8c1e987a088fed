"""The job rule: which processes belong together, and which are nobody's job.

``clear`` terminates whole jobs, never single workers of a tensor-parallel
server, and never what the user's session stands on. The rule is stated here
once, as functions of a :class:`ProcessView` (a consistent view of the process
table), and documented word for word in docs/clear.md ("The job rule"):

*Protected* — never a target, never climbed or descended through — is decided
from kernel facts, never from what a process says about itself (its name and
argv are its own to rewrite): gpuslate itself and each of its ancestors; PID 1
and kernel threads (``PF_KTHREAD``); by the program it runs
(``/proc/PID/exe``, when that file is root's and writable by no one else: a
user's own copy named ``sshd`` protects nothing): init systems, subreapers and session infrastructure
(``systemd``, tini, sshd, login, su, sudo, container runtimes and shims),
terminal multiplexers, and interactive shells (a program listed in
``/etc/shells`` started without a script or ``-c`` command, a login shell, or
one that leads its session on a terminal); and a process whose program cannot
be read at all (unknown is never a target). A shell running a script
(``bash run_server.sh``) or a command (``bash -c ...``) is not protected: it
belongs to the job it launched.

*Root of a holder's job*: the leader of the holder's process group if it lives
and is not protected; otherwise the highest ancestor of the holder still in
the holder's process group, climbing parent by parent and stopping before a
protected process (at least the holder itself). A process group that means
nothing from here (``pgid`` 0: its leader lives outside our PID namespace) is
no group: the root is the holder itself.

*The job of a root*: the root and its descendants; plus, when the root leads
its group, every other member of the group and their descendants; plus, when
the group's leader has exited, the members of the group that hold GPU memory
(workers reparented away from a launcher that exited) and their descendants —
unless a protected process (the caller, say) still lives in that group: then
the group is shared with something that is nobody's job, and membership proves
nothing. Descent never passes through a protected process, so a program that
starts a holder and clears it never loses its other children.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from .procfs import ProcStat, SignalFacts

#: shells known without /etc/shells (busybox's applets, minimal images without the file)
DEFAULT_SHELLS = frozenset({"bash", "sh", "dash", "zsh", "fish", "ksh", "mksh", "tcsh", "csh", "busybox", "ash",
                            "rbash", "yash", "ksh93", "pdksh", "oksh", "loksh", "posh"})
#: programs of terminal multiplexers, by the basename of /proc/PID/exe
MULTIPLEXERS = frozenset({"tmux", "screen", "zellij", "byobu", "abduco", "dtach"})
#: programs of init systems, subreapers and session infrastructure: where sessions and containers stand
SESSION_DAEMONS = frozenset({
    "systemd", "init", "tini", "tini-static", "dumb-init", "docker-init", "catatonit", "s6-svscan",
    "s6-supervise", "runsv", "runsvdir", "sshd", "sshd-session", "sshd-auth", "login", "su", "sudo",
    "conmon", "runc", "crun", "containerd", "dockerd", "kubelet", "podman", "systemd-nspawn",
})
#: the protection of a process whose program cannot be read: unknown is never a target
UNKNOWN_PROGRAM = "its program cannot be read (/proc/PID/exe): unknown is never a target"
#: shell options that take an argument (bash, dash, zsh, ksh): their argument is no script
_SHELL_OPTIONS_WITH_ARG = frozenset({"-o", "+o", "-O", "+O", "--rcfile", "--init-file"})


def system_shells(path: str = "/etc/shells") -> frozenset[str]:
    """The basenames of the shells this system lists in ``/etc/shells``, with the usual ones."""
    try:
        with open(path, "rb") as f:
            listed = {line.strip().decode("utf-8", "replace").rsplit("/", 1)[-1] for line in f
                      if line.strip() and not line.lstrip().startswith(b"#")}
    except OSError:
        listed = set()
    return DEFAULT_SHELLS | frozenset(listed)


_shells: frozenset[str] | None = None


def shells() -> frozenset[str]:
    global _shells
    if _shells is None:
        _shells = system_shells()
    return _shells


def program(exe: str | None) -> str | None:
    """The basename of an executable path, without the kernel's " (deleted)" mark."""
    if exe is None:
        return None
    if exe.endswith(" (deleted)"):
        exe = exe[: -len(" (deleted)")]
    return exe.rsplit("/", 1)[-1]


class ProcessView(Protocol):
    """A consistent view of the process table (``ProcTable`` reads /proc; tests build one)."""

    def get(self, pid: int) -> ProcStat | None: ...

    def children(self, pid: int) -> list[int]: ...

    def group_members(self, pgid: int) -> list[int]: ...

    def argv(self, pid: int) -> tuple[str, ...]: ...

    def uid(self, pid: int) -> int | None: ...

    def exe(self, pid: int) -> str | None:
        """``/proc/PID/exe``; None when it cannot be read."""
        ...

    def exe_is_system(self, pid: int) -> bool:
        """Whether that program's file is root's and writable by no one else."""
        ...

    def signal_facts(self, pid: int) -> SignalFacts | None: ...

    def pid_ns(self, pid: int) -> tuple[int, ...] | None:
        """The inodes of the process's PID namespace and its parents; None when unknown."""
        ...

    def all_pids(self) -> list[int]: ...

    def session_members(self, sid: int) -> list[int]: ...


def shell_runs_script(argv: tuple[str, ...]) -> bool:
    """Whether a shell's argv names a script operand or a ``-c`` command (then it is
    no one's interactive session). Options that take an argument (``-o posix``,
    ``--rcfile FILE``) are skipped with it; ``--`` ends the options; ``-s`` and
    ``-i`` make the shell read commands from its input (interactive)."""
    i = 1
    while i < len(argv):
        a = argv[i]
        if a == "--" or a == "-":
            return i + 1 < len(argv)
        if a in _SHELL_OPTIONS_WITH_ARG:
            i += 2
            continue
        if a.startswith("--"):
            i += 1
            continue
        if a.startswith(("-", "+")) and len(a) > 1:
            letters = a[1:]
            if a.startswith("-") and "c" in letters:
                return True
            if "s" in letters or "i" in letters:
                return False
            if letters[-1:] in ("o", "O"):  # -eo pipefail: the last letter takes the next word
                i += 2
                continue
            i += 1
            continue
        return True  # the first operand: a script
    return False


def is_interactive_shell(st: ProcStat, argv: tuple[str, ...], exe: str | None, system: bool = True) -> bool:
    """A shell (a program of ``/etc/shells``) that reads commands from a person rather
    than running a script.

    ``bash``, ``-bash`` (login), ``bash -l``, ``zsh -i``, ``bash -o vi`` are
    interactive; ``bash run.sh`` and ``bash -c 'cmd'`` are not, unless they lead
    their session on a terminal (then they are someone's login session). What a
    shell is comes from its executable, never from its name.
    """
    if not system or program(exe) not in shells():
        return False
    if st.pid == st.sid and st.tty_nr != 0:
        return True
    if argv and argv[0].startswith("-"):
        return True  # login shell
    return not shell_runs_script(argv)


def static_protection(view: ProcessView, pid: int) -> str | None:
    """Why ``pid`` is protected whoever asks, or None (from kernel facts only)."""
    st = view.get(pid)
    if pid == 1:
        return "PID 1 (init)"
    if st is None:
        return None
    if st.is_kernel_thread:
        return "a kernel thread"
    if st.has_exited:
        return None  # a zombie: nothing left to protect or to signal
    exe = view.exe(pid)
    prog = program(exe)
    if prog is None:
        return UNKNOWN_PROGRAM
    if not view.exe_is_system(pid):
        return None  # a program of a user's own: whatever its file is called, it protects nothing
    if prog in MULTIPLEXERS:
        return f"a terminal multiplexer ({prog})"
    if prog in SESSION_DAEMONS or prog.startswith("containerd-shim"):
        return f"session or container infrastructure ({prog})"
    if is_interactive_shell(st, view.argv(pid), exe):
        return f"an interactive shell ({prog})"
    return None


class Protection:
    """Protection as seen by one caller: the static rule plus the caller and its ancestors.

    ``caller_uid`` (when given): another user's process whose program a non-root caller
    cannot read is not protected for being unknown — this caller cannot signal it either,
    and the kernel's refusal is the better report ("permission denied")."""

    def __init__(self, view: ProcessView, caller_pid: int | None, caller_uid: int | None = None) -> None:
        self.view = view
        self.caller = caller_pid
        self.caller_uid = caller_uid
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
                if why == UNKNOWN_PROGRAM and self.caller_uid not in (None, 0) \
                        and self.view.uid(pid) not in (None, self.caller_uid):
                    why = None
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


def descendants(view: ProcessView, pid: int, protected: Protection,
                left: Callable[[int], None] | None = None) -> list[int]:
    """Every descendant of ``pid``, not descending through protected processes;
    ``left`` is told each protected process met on the way (considered and left)."""
    out: list[int] = []
    seen = {pid}
    stack = list(view.children(pid))
    while stack:
        p = stack.pop()
        if p in seen:
            continue
        seen.add(p)
        if protected(p):
            if left is not None:
                left(p)
            continue
        out.append(p)
        stack.extend(view.children(p))
    return out


def _alive(st: ProcStat | None) -> bool:
    return st is not None and not st.has_exited


def group_known(st: ProcStat) -> bool:
    """Whether the process's group and session mean something from here: inside a PID
    namespace whose group or session leader lives outside it, the kernel reports 0."""
    return st.pgid > 0 and st.sid > 0


def job_root(view: ProcessView, pid: int, protected: Protection,
             left: Callable[[int], None] | None = None) -> int:
    """The root of ``pid``'s job (see the module doc); ``left`` is told the protected
    process the climb stopped before, when one did."""
    st = view.get(pid)
    if st is None or not group_known(st):
        return pid
    if _leads(view, st.pgid) and not protected(st.pgid):
        return st.pgid
    return _climb(view, st, protected, left)


def _leads(view: ProcessView, pgid: int) -> bool:
    """Whether process ``pgid`` lives and still leads group ``pgid`` (a group's leader is the
    process whose pid is the group's id: a process by that number in another group is none)."""
    leader = view.get(pgid)
    return _alive(leader) and leader is not None and leader.pgid == pgid


def _climb(view: ProcessView, st: ProcStat, protected: Protection, left: Callable[[int], None] | None) -> int:
    """The highest ancestor of ``st`` still in its process group, stopping before a protected one."""
    root = st.pid
    cur = st
    seen = {st.pid}
    while cur.ppid > 0 and cur.ppid not in seen:
        parent = view.get(cur.ppid)
        if parent is None or parent.pgid != st.pgid:
            break
        if protected(parent.pid):
            if left is not None:
                left(parent.pid)
            break
        seen.add(parent.pid)
        root, cur = parent.pid, parent
    return root


def shared_group(view: ProcessView, pgid: int, protected: Protection) -> int | None:
    """A live protected member of group ``pgid`` (the caller, a shell), or None."""
    for m in view.group_members(pgid):
        if _alive(view.get(m)) and protected(m):
            return m
    return None


def job_members(view: ProcessView, root: int, gpu_memory_holders: Iterable[int],
                protected: Protection, left: Callable[[int], None] | None = None) -> list[int]:
    """The processes of the job rooted at ``root``, root first, each once; ``left`` is
    told each protected process met (considered and left)."""
    st = view.get(root)
    members = [root]
    if st is None:
        return members
    seeds: list[int] = []
    if group_known(st):
        if st.pgid == root:
            seeds = [m for m in view.group_members(st.pgid) if m != root]
        elif not _leads(view, st.pgid) and shared_group(view, st.pgid, protected) is None:
            # the group's holders, each from its highest ancestor in the group (the wrapper that
            # started it, like the root's own climb)
            holders = set(gpu_memory_holders)
            seeds = []
            for m in view.group_members(st.pgid):
                mst = view.get(m)
                if m != root and m in holders and mst is not None:
                    seeds.append(_climb(view, mst, protected, left))
    seen = {root}
    for p in [root, *seeds]:
        if p != root:
            if p in seen:
                continue
            seen.add(p)
            if protected(p):
                if left is not None:
                    left(p)
                continue
            members.append(p)
        for d in descendants(view, p, protected, left):
            if d not in seen:
                seen.add(d)
                members.append(d)
    return members
