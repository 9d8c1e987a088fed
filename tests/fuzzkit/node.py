"""The program every process of a forest runs: ``python node.py RUNFILE NODE_ID REPORT_FD``.

A node applies its spec (:class:`fuzzkit.forest.NodeSpec`) in this order: becomes the second user
(``as_other``), makes its own session or group, renames itself (the way its spec says), sets what
SIGTERM does, starts its children (by fork, double fork, or by exec'ing ``runuser``/``su``/
``setpriv``/``unshare``/a GPU daemon's program/this interpreter under another argv[0] with this
program again), waits if it starts late, holds its simulated GPU memory or device handles (after
the forks: what a node holds is its own, not inherited), reports ``{"id", "pid"}`` on the report
pipe, then exits (a leader that exits), ends its main thread while a second thread keeps it
(``main_exits``), or sleeps until a signal ends it. It reports each child it reaps with the
child's wait status, so that a death is explained (a SIGHUP is the kernel's, not gpuslate's).

Most nodes are forked, not exec'd (a fork of a loaded interpreter costs a millisecond, a Python
start-up tens): only the shapes that need another program exec. Pids are reported as this fuzzer's
PID namespace sees them (``/proc/self``), also from inside a nested namespace, as the driver and
gpuslate see them.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import shlex
import signal
import sys
import termios
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

# exec'd nodes run this file as a script, under another user's system Python too
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gpuslate.gpu.simhost.host import SimHost
from gpuslate.proc.procfs import identity

PR_SET_NAME = 15


class Node:
    def __init__(self, run: dict[str, Any], report_fd: int) -> None:
        self.run = run
        self.nodes: dict[str, dict[str, Any]] = run["forest"]["nodes"]
        self.fd = report_fd
        self.children: list[int] = []  # direct children, for forwarding

    # -- helpers ------------------------------------------------------------------
    def report(self, doc: dict[str, Any]) -> None:
        os.write(self.fd, (json.dumps(doc) + "\n").encode())

    def exec_node(self, spec: dict[str, Any]) -> NoReturn:
        """In a forked child: exec the wrapper that starts ``spec`` with this program (or the program
        that is this interpreter under another name, or this interpreter under another argv[0])."""
        other = self.run["other"]
        prog = [self.run["python_other" if spec["other"] else "python"], os.path.abspath(__file__),
                self.run["runfile"], spec["id"], str(self.fd)]
        path = None  # the file exec'd, where it is not argv[0]
        if spec["start"] == "daemon":  # the program is a copy of this interpreter that is that program
            argv = [self.run["programs"][spec["program"]], *prog[1:]]
            if spec.get("preload"):  # a look-alike: code preloaded into the daemon's very program
                os.environ["LD_PRELOAD"] = self.run["preload"]
        elif spec["rename"] == "exec_a":  # bash's exec -a: argv[0] is the title, the program is python
            path, argv = prog[0], [spec["title"] or f"fuzz-{spec['id']}", *prog[1:]]
            # Python finds its library from argv[0] (searched on PATH: "bash" is /usr/bin/bash): say where
            os.environ["PYTHONHOME"] = self.run["python_home_other" if spec["other"] else "python_home"]
        elif spec["start"] == "runuser":
            argv = ["runuser", "-u", other["name"], "--", *prog]
        elif spec["start"] == "su":
            argv = ["su", "-s", "/bin/sh", other["name"], "-c", "exec " + " ".join(map(shlex.quote, prog))]
        elif spec["start"] == "setpriv":
            argv = ["setpriv", f"--reuid={other['uid']}", f"--regid={other['gid']}", "--clear-groups", "--", *prog]
        else:
            argv = ["unshare", "--fork", "--pid", "--", *prog]
        os.set_inheritable(self.fd, True)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        try:
            os.execvp(path or argv[0], argv)
        finally:
            os._exit(127)

    def spawn(self, spec: dict[str, Any]) -> None:
        start = spec["start"]
        pid = os.fork()
        if pid == 0:
            try:
                if start == "double_fork" and os.fork() != 0:
                    os._exit(0)
                if start in ("runuser", "su", "setpriv", "unshare", "daemon"):
                    self.exec_node(spec)
                if start == "as_other":
                    other = self.run["other"]
                    os.setgroups([])
                    os.setgid(other["gid"])
                    os.setuid(other["uid"])
                if spec["rename"] == "exec_a":
                    self.exec_node(spec)
                self.become(spec["id"])
            finally:
                os._exit(1)
        if start == "double_fork":
            _waitpid(pid)  # the middle process exits at once
        else:
            self.children.append(pid)

    # -- the node's life ------------------------------------------------------------
    def become(self, node_id: str) -> NoReturn:
        """Turn this process into node ``node_id`` (see the module doc); a failure is reported."""
        try:
            self._become(node_id)
        except BaseException as exc:  # say so at once, never fall back into the parent's code
            self.report({"event": "failed", "id": node_id, "error": f"{type(exc).__name__}: {exc}"})
        finally:
            os._exit(1)

    def _become(self, node_id: str) -> None:
        spec = self.nodes[node_id]
        self.children = []
        os.closerange(3, self.fd)  # what the forking process had open (its own pipes) is not ours
        os.closerange(self.fd + 1, 256)
        leader = os.getsid(0) == os.getpid()  # su makes its child a session leader already
        if spec["group"] == "setsid" and not leader:
            os.setsid()
        elif spec["group"] == "setpgid" and not leader:
            os.setpgid(0, 0)
        if spec["program"] is None:  # a GPU daemon keeps its program's name, as the real ones do
            set_title(spec["title"] if spec["title"] is not None else f"fuzz-{node_id}", spec["rename"])
        signal.signal(signal.SIGCHLD, self.reap)
        term = spec["term"]
        if term == "ignore":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        elif term == "stay":
            signal.signal(signal.SIGTERM, lambda *_: None)
        elif term == "forward":
            signal.signal(signal.SIGTERM, self.forward)
        elif term == "fork":
            signal.signal(signal.SIGTERM, self.fork_helper)
        else:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        terminal = self.take_terminal() if spec.get("tty") else []  # before the children: they share it
        for cid in spec["children"]:
            self.spawn(self.nodes[cid])
        if spec["delay_ms"]:
            time.sleep(spec["delay_ms"] / 1000)  # a holder that starts late (a loaded machine)
        fds = self.hold(spec) + terminal  # after the children: they do not inherit the device files
        self.report({"event": "ready", "id": node_id, "pid": host_pid()})
        if spec["exits"]:
            os._exit(0)
        if spec["main_exits"]:  # the process lives on in its second thread; Python's handlers never run again
            threading.Thread(target=threading.Event().wait, name="keeper").start()
            ctypes.CDLL(None).pthread_exit(None)
        # a "stopped" node is stopped by the driver once the forest's exiting leaders are gone: one
        # that stopped itself before its group's leader exited got the kernel's SIGHUP for the
        # orphaned group -- a forest killing its own nodes during set-up, seen as gpuslate's doing
        del fds  # kept open for the process's life by the frames above
        while True:
            signal.pause()

    def take_terminal(self) -> list[int]:
        """Make a pty this session's controlling terminal (the node leads its session)."""
        if os.getsid(0) != os.getpid():
            os.setsid()
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
        return [master, slave]

    def hold(self, spec: dict[str, Any]) -> list[int]:
        if not spec["hold"] and not spec["handles"]:
            return []
        host = SimHost(self.run["sim"])
        fds = [os.open(host.dev / "nvidiactl", os.O_RDONLY)]
        me = identity(host_pid())
        assert me is not None
        for gpu, nbytes in spec["hold"]:
            fds.append(os.open(host.device_path(gpu), os.O_RDONLY))
            host.add_record(gpu, me, nbytes, kind="mps" if gpu in spec.get("mps_gpus", ()) else "compute")
        for gpu in spec["handles"]:
            fds.append(os.open(host.device_path(gpu), os.O_RDONLY))
        return fds

    def reap(self, signum: int, frame: object) -> None:
        """Reap every exited child; a reaped pid is no longer ours to signal (it may be reused)."""
        try:
            while (got := os.waitpid(-1, os.WNOHANG))[0] > 0:
                pid, status = got
                self.report({"event": "reaped", "pid": pid, "status": status})
                if pid in self.children:
                    self.children.remove(pid)
        except ChildProcessError:
            pass

    def forward(self, signum: int, frame: object) -> None:
        """Like runuser and su: pass SIGTERM on to the children, wait for them, exit."""
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])  # none reaped (and reused) meanwhile
        for pid in self.children:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for pid in self.children:
            _waitpid(pid)
        os._exit(0)

    def fork_helper(self, signum: int, frame: object) -> None:
        """A shutdown hook: fork a helper, wait for it, exit."""
        me = host_pid()
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            self.report({"event": "forked", "pid": host_pid(), "ppid": me})
            while True:
                signal.pause()
        _waitpid(pid)
        os._exit(0)


def _waitpid(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass  # reaped by the SIGCHLD handler already




def host_pid() -> int:
    """This process's pid in the fuzzer's namespace (the /proc mounted there), also from a nested one."""
    return int(os.readlink("/proc/self"))


def set_title(title: str, how: str = "setproctitle") -> None:
    """Rename this process (see :class:`fuzzkit.forest.Rename`): argv and comm through setproctitle
    where it is installed (with ``SPT_NOENV`` for ``setproctitle_noenv``: a forked child of a process
    that set a title already keeps its way), or comm only; exec_a renamed it at exec already."""
    if how == "exec_a":
        return
    if how != "prctl":
        if how == "setproctitle_noenv":
            os.environ["SPT_NOENV"] = "1"
        try:
            import setproctitle

            setproctitle.setproctitle(title)
        except ImportError:
            pass
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, title.encode()[:15], 0, 0, 0)


def main(argv: list[str]) -> NoReturn:
    os.environ.pop("PYTHONHOME", None)  # what an exec_a start told this interpreter: not for its children
    runfile, node_id, fd = argv[1], argv[2], int(argv[3])
    with open(runfile) as f:
        run = json.load(f)
    try:
        Node(run, fd).become(node_id)
    finally:
        os._exit(1)


if __name__ == "__main__":
    main(sys.argv)
