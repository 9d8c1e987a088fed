"""An interrupted `up` stops what it started and verifies the GPUs, and neither a second Ctrl-C nor
a SIGTERM cuts that short; a SIGTERM to `up` cleans up like Ctrl-C; after a SIGKILL of `up`, `ps`
judges the unit by what lives and what it answers, never `starting` for ever."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import signal
import subprocess
import sys
import termios
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from gpuslate.units.readiness import http
from helpers import gpuslate_env, is_gone, unit_records, wait_for
from test_units_lifecycle import gpus_clean, ps
from unitkit import free_port, serve_cmd


class Up:
    """`gpuslate up ...` as a process whose stderr lines are collected as they come."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "gpuslate", "up", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=gpuslate_env(), start_new_session=True)
        self.err: list[str] = []
        self._reader = threading.Thread(target=lambda: self.err.extend(iter(self.proc.stderr.readline, "")),
                                        daemon=True)
        self._reader.start()

    def said(self, text: str) -> int:
        return sum(text in line for line in list(self.err))

    def finish(self, timeout: float = 30) -> int:
        rc = self.proc.wait(timeout)
        self._reader.join(5)
        self.proc.stdout.close()
        self.proc.stderr.close()
        return rc


def holding(host, gpu: int):
    return next((h.record.pid for h in host.held() if h.alive and h.record.gpu == gpu), None)


HOLD = [sys.executable, "-m", "gpuslate", "sim", "hold", "--memory", "2GiB", "--gpus", "0", "--ignore-term"]


def test_cleanup_after_ctrl_c_survives_a_second_ctrl_c_and_sigterm(units_host):
    up = Up("web", "--gpus", "0", "--ready-log", "never printed", "--start-timeout", "60", "--grace", "2", "--",
            *HOLD)
    pid = wait_for(lambda: holding(units_host, 0), timeout=20)
    os.kill(up.proc.pid, signal.SIGINT)
    wait_for(lambda: up.said("stopping web, please wait"), timeout=60)
    # the holder ignores SIGTERM: cleanup lasts the whole 2 s grace; interrupt it twice more
    os.kill(up.proc.pid, signal.SIGINT)
    os.kill(up.proc.pid, signal.SIGTERM)
    wait_for(lambda: up.said("stopping web, please wait") >= 3, timeout=60)  # both noted, neither obeyed
    assert up.proc.poll() is None or is_gone(pid)
    rc = up.finish()
    assert rc == 130, up.err
    assert is_gone(pid) and gpus_clean(units_host, [0])  # gone before up exited: cleanup ran to its end
    assert not any("Traceback" in line for line in up.err), up.err
    rec = unit_records().load("web")
    assert rec.phase == "failed" and "interrupted" in rec.failure
    assert ps_state("web") == "failed"


def test_sigterm_to_up_cleans_up_like_ctrl_c(units_host):
    up = Up("web", "--gpus", "0", "--ready-log", "never printed", "--start-timeout", "60", "--grace", "0.5",
            "--", *HOLD)
    pid = wait_for(lambda: holding(units_host, 0), timeout=20)
    os.kill(up.proc.pid, signal.SIGTERM)
    rc = up.finish()
    assert rc == 130, up.err
    assert up.said("stopping web, please wait") and not any("Traceback" in line for line in up.err)
    assert is_gone(pid) and gpus_clean(units_host, [0])
    assert unit_records().load("web").phase == "failed"


@pytest.mark.slow
def test_sigkill_of_up_leaves_a_unit_judged_by_what_lives(units_host, units):
    port = free_port()
    up = Up("web", "--gpus", "0-1", "--port", str(port), "--engine", "sglang", "--start-timeout", "60", "--",
            *serve_cmd(port, startup=4.0))
    wait_for(lambda: unit_records().load("web") is not None, timeout=20)
    os.kill(up.proc.pid, signal.SIGKILL)
    up.finish()
    early = ps(units)["web"]["state"]
    assert early in ("orphaned", "ready")  # loading, nobody waits for it: never `starting` for ever
    wait_for(lambda: serving(port), timeout=20, interval=0.05)
    assert ps(units)["web"]["state"] == "ready"  # it answers its readiness check
    r = units("down", "web", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["previous_state"] == "ready" and ps(units)["web"]["state"] == "stopped"


def serving(port: int) -> bool:
    try:
        return json.loads(http("GET", f"http://127.0.0.1:{port}/get_server_info")[1])["status"] == "ready"
    except OSError:
        return False


def ps_state(name: str) -> str:
    from unitkit import run_units

    return ps(run_units)[name]["state"]


@contextmanager
def on_terminal(*args: str) -> Iterator[tuple[subprocess.Popen[bytes], Callable[[], None], Callable[[bytes], bool]]]:
    """``gpuslate ARGS`` as the session leader of a pseudo-terminal of its own; yields the process,
    ``hang_up()`` (close the terminal: the kernel sends SIGHUP, later writes fail) and ``seen(text)``
    (whether the output so far holds ``text``, reading what is there). The process is killed on the
    way out if it is still running."""
    master, slave = pty.openpty()
    out = bytearray()

    def take_terminal() -> None:  # in the child, after setsid: the pty becomes its controlling terminal
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen([sys.executable, "-m", "gpuslate", *args], stdin=slave, stdout=slave, stderr=slave,
                            env=gpuslate_env(), start_new_session=True, preexec_fn=take_terminal)
    os.close(slave)
    open_fd = [master]

    def hang_up() -> None:
        if open_fd:
            os.close(open_fd.pop())

    def seen(text: bytes) -> bool:
        if open_fd:
            out.extend(os.read(open_fd[0], 4096))
        return text in out

    try:
        yield proc, hang_up, seen
    finally:
        hang_up()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_hangup_of_up_stops_the_starting_server(units_host):
    """The ssh session drops while `up` waits for a server to load: the kernel sends SIGHUP to `up`
    (the session leader of the terminal) and every later write to the terminal fails. The server,
    in a session of its own, would go on starting and hold its GPUs; `up` stops it, verifies the
    GPUs free and records the unit failed, all without a terminal to report to."""
    port = free_port()
    with on_terminal("up", "web", "--gpus", "0-1", "--port", str(port), "--engine", "sglang", "--start-timeout",
                     "120", "--grace", "1", "--", *serve_cmd(port, startup=60.0)) as (proc, hang_up, _seen):
        wait_for(lambda: holding(units_host, 0) and holding(units_host, 1), timeout=30)
        rec = unit_records().load("web")
        assert rec is not None and rec.phase == "starting"
        server = [rec.pid, holding(units_host, 0), holding(units_host, 1)]
        hang_up()  # the terminal goes away: SIGHUP to up, EIO on every later write
        rc = proc.wait(60)
    assert all(is_gone(p) for p in server)  # gone before up exited: it stopped and waited for them
    assert gpus_clean(units_host, [0, 1])
    rec = unit_records().load("web")
    assert rec.phase == "failed" and "SIGHUP" in rec.failure, rec.failure
    assert rc == 130, rc
    assert ps_state("web") == "failed"


def test_hangup_of_down_does_not_leave_the_unit_half_stopped(units_host, units):
    """`down` of a unit that ignores SIGTERM waits out the grace before SIGKILL; the ssh session
    drops meanwhile. `down` finishes: SIGKILL, the GPUs verified, the unit recorded stopped."""
    survivor = [a for a in HOLD if a != "--ignore-term"] + ["--survive-term"]  # only SIGKILL ends it
    r = units("up", "web", "--gpus", "0", "--ready-log", '"pid"', "--", *survivor)
    assert r.returncode == 0, r.stderr
    pid = holding(units_host, 0)
    with on_terminal("down", "web", "--grace", "3") as (proc, hang_up, seen):
        wait_for(lambda: seen(b"SIGTERM sent"), timeout=20)
        hang_up()  # SIGHUP to down, in the middle of its grace
        proc.wait(60)
    assert is_gone(pid) and gpus_clean(units_host, [0])
    assert unit_records().load("web").phase == "stopped" and ps_state("web") == "stopped"
