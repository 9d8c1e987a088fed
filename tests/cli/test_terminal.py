"""What a person sees: tables on real pseudo-terminals of 80, 120 and 200 columns,
piped output, and process titles that try to drive the terminal."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import socket
import struct
import subprocess
import sys
import termios
import textwrap
import time

import pytest

from helpers import gpuslate_env, is_gone

EVIL = "\x1b[2J\x1b[31mEVIL\x9b31m\u202eworker"
LONG = " --model-path /models/meta-llama/Meta-Llama-3.1-405B-Instruct-FP8 --tensor-parallel-size 8 --port 30000"
SGR = re.compile(r"\x1b\[[0-9;]*m")  # rich's own colours: the only escapes allowed


def on_pty(args: list[str], cols: int, *, answer: str | None = None, after: float = 0.0,
           stdout_pipe: bool = False) -> tuple[int, str, str]:
    """Run gpuslate with a pseudo-terminal of ``cols`` columns as its terminal
    (stdin, stderr, and stdout unless ``stdout_pipe``); answer a prompt if asked.
    Returns (exit code, what the terminal showed, stdout when piped)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, cols, 0, 0))
    env = gpuslate_env({"TERM": "xterm-256color"})
    for k in ("COLUMNS", "LINES", "NO_COLOR"):
        env.pop(k, None)
    p = subprocess.Popen([sys.executable, "-m", "gpuslate", *args], stdin=slave, stderr=slave,
                         stdout=subprocess.PIPE if stdout_pipe else slave, env=env, start_new_session=True)
    os.close(slave)
    shown = b""
    answered = answer is None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            shown += chunk
        if not answered and b"[y/N]" in shown:
            time.sleep(after)  # a person taking their time to answer: what the test is about
            os.write(master, answer.encode() + b"\n")
            answered = True
        if p.poll() is not None and not ready:
            break
    out = p.stdout.read().decode() if stdout_pipe else ""
    p.wait(30)
    os.close(master)
    return p.returncode, shown.decode("utf-8", "replace").replace("\r\n", "\n"), out


def visible(text: str) -> str:
    return SGR.sub("", text)


def assert_no_raw_escapes(text: str) -> None:
    rest = SGR.sub("", text)
    assert "\x1b" not in rest and "\x9b" not in rest and "\u202e" not in rest, repr(rest[:400])
    assert "\\x1b[2J\\x1b[31mEVIL\\x9b31m\\u202eworker" in rest


@pytest.fixture
def evil_job(sim_host, hold):
    return hold("--gpus", "0-1", "--memory", "3GiB", "--workers", "2", "--title", EVIL + LONG)


@pytest.mark.parametrize("cols", [80, 120])
def test_status_table_fits_and_keeps_numbers_readable(evil_job, cols):
    code, shown, _ = on_pty(["status"], cols)
    assert code == 0, shown
    lines = visible(shown).splitlines()
    assert max(len(line) for line in lines) <= cols, "\n".join(lines)
    header = next(line for line in lines if line.split()[:2] == ["GPU", "PID"])
    extras = ["CPU", "Host", "mem", "Elapsed"] if cols >= 120 else []  # where the command keeps room with them
    assert header.split() == ["GPU", "PID", "Kind", "GPU", "memory", "User", *extras, "Command"]
    for w in evil_job.workers:
        row = next(line for line in lines if f"└ {w} " in line)
        # the PID, the memory and the user whole; the command cut from the middle: its program
        # and the end of its arguments stay
        assert re.search(rf"^ +[01] └ {w} compute +3\.0 GiB root ", row), row
        assert "worker …" in row and (cols < 120 or row.endswith("--port 30000")), row
    assert_no_raw_escapes(shown)


def test_clear_plan_fits_80_columns(evil_job):
    code, shown, _ = on_pty(["clear", "--dry-run"], 80)
    assert code == 0, shown
    lines = visible(shown).splitlines()
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)
    for pid in evil_job.workers:
        row = next(line for line in lines if line.lstrip().startswith(f"{pid} "))
        assert re.match(rf" *{pid} holder +root +[01] +3\.0 GiB \\x1b", row), row
    assert_no_raw_escapes(shown)


def test_launcher_row_at_200_columns_has_user_under_user(evil_job):
    """The launcher's user under User; its command in the width of the cells it leaves empty (it holds
    no GPU: no CPU, host memory or time columns of its own), from the column after User."""
    code, shown, _ = on_pty(["status"], 200)
    assert code == 0
    lines = visible(shown).splitlines()
    header = next(line for line in lines if line.split()[:2] == ["GPU", "PID"])
    row = next(line for line in lines if "launcher" in line)
    user_col = header.index("User")
    assert row[user_col:user_col + 5] == "root " and row[user_col + 5:].startswith("\\x1b[2J"), (header, row)


def test_piped_output_has_no_padding_and_no_escapes(evil_job, cli):
    for args in (["status"], ["clear", "--dry-run"]):
        r = cli(*args)
        assert r.returncode == 0, r.stderr
        assert all(line == line.rstrip() for line in r.stdout.splitlines()), args
        assert "\x1b" not in r.stdout
        assert_no_raw_escapes(r.stdout)


def test_piped_audit_log_neither_wraps_nor_injects(evil_job, cli):
    r = cli("clear", "--gpus", "0-1", "--yes")
    assert r.returncode == 0
    lines = r.stdout.splitlines()  # the report: one statement a line
    assert "GPU memory before → after" in lines and "  GPU 1: 3.0 GiB → 0 B" in lines, r.stdout
    assert [ln for ln in lines if ln.startswith("Clean: ")], r.stdout
    r = cli("audit")
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if "SIGTERM" in line]
    assert len(rows) == 3  # one line per entry: nothing wrapped mid-word onto a next line
    assert all(line == line.rstrip() for line in r.stdout.splitlines())
    for row in rows[1:]:
        assert_no_raw_escapes(row)
        assert "--tensor-parallel-size 8 --port 30000" in row  # whole, piped


def test_audit_table_on_an_80_column_terminal(evil_job, cli):
    assert cli("clear", "--gpus", "0-1", "--yes").returncode == 0
    code, shown, _ = on_pty(["audit"], 80)
    assert code == 0
    assert max(len(line) for line in visible(shown).splitlines()) <= 80
    assert "\x1b[2J" not in shown and "\x9b" not in shown


def test_prompt_escapes_and_its_wait_is_not_counted(evil_job):
    code, shown, out = on_pty(["clear", "--gpus", "0-1", "--json", "--timeout", "1.5"], 100, answer="y",
                              after=2.0, stdout_pipe=True)
    assert code == 0, shown
    assert "Terminate these 3 processes? [y/N]" in shown
    assert_no_raw_escapes(shown)
    doc = json.loads(out)
    # the 2 s the person took are neither in the timings nor spent from --timeout 1.5
    assert doc["status"] == "clean" and doc["timings"]["total_s"] < 1.5, doc["timings"]
    assert all(is_gone(p) for p in evil_job.pids)


def test_prompt_answered_no_signals_nothing(evil_job):
    code, shown, _ = on_pty(["clear", "--gpus", "0-1"], 80, answer="n")
    assert code == 130
    assert "gpuslate: not confirmed: nothing was signaled" in shown and "error" not in visible(shown)
    assert not any(is_gone(p) for p in evil_job.pids)


def test_up_clear_on_a_terminal_asks_with_the_plan(sim_host, hold):
    """``up --clear`` on a terminal shows clear's plan and asks, as clear does; "n" starts nothing."""
    victim = hold("--gpus", "2", "--memory", "2GiB")
    code, shown, _ = on_pty(["up", "web", "--gpus", "2", "--clear", "--ready-log", "x", "--", "sleep", "60"], 100,
                            answer="n")
    assert code == 130 and "Terminate this process? [y/N]" in shown, shown
    assert str(victim.pid) in shown and "nothing was signaled" in shown
    assert not is_gone(victim.pid)


HANDLES = textwrap.dedent("""
    import os, sys, time
    from gpuslate.gpu.simhost.host import SimHost
    from gpuslate.proc.procfs import identity
    host = SimHost(sys.argv[1])
    fds = [os.open(host.device_path(g), os.O_RDWR) for g in range(4)]  # like CUDA: every device node
    host.add_record(0, identity(os.getpid()), 2 << 30)  # memory on GPU 0 only
    print("ready", flush=True)
    time.sleep(600)
""")


def test_gpu_column_shows_memory_gpus_and_marks_handles_apart(sim_host, cli):
    p = subprocess.Popen([sys.executable, "-c", HANDLES, str(sim_host.root)], stdout=subprocess.PIPE, text=True,
                         env=gpuslate_env(), start_new_session=True)
    try:
        assert p.stdout.readline() == "ready\n"
        r = cli("status")
        row = next(line for line in r.stdout.splitlines() if f" {p.pid} " in line)
        assert row.split()[:5] == ["0", "(+1-3", "handle)", str(p.pid), "compute"], row
        assert "2.0 GiB" in row
    finally:
        p.kill()
        p.wait()


def test_a_wait_is_shown_in_place_on_a_terminal_and_nothing_extra_piped(sim_host, hold, cli):
    hold("--gpus", "0", "--memory", "2GiB")
    code, shown, _ = on_pty(["wait", "--free", "--gpus", "0", "--timeout", "1.5"], 120)
    assert code == 4
    assert "waiting for GPU 0 to be free" in shown and "GPU 0 (1 process) 2.0 GiB still used" in shown
    assert "\r\x1b[K" in shown  # redrawn in place, and erased before the result
    code, shown, _ = on_pty(["wait", "--free", "--gpus", "0", "--timeout", "0.6"], 60)
    # cut to 59 columns (the last one would wrap on some terminals)
    assert code == 4 and "\r\x1b[K\x1b[2m⠋ waiting for GPU 0 to be free 0.0s of 0.6s  GPU 0 (1 proc…" in shown
    code, shown, out = on_pty(["wait", "--free", "--gpus", "0", "--timeout", "1", "--json"], 80, stdout_pipe=True)
    assert code == 4 and "waiting for" not in shown and json.loads(out)["status"] == "not_free"
    r = cli("wait", "--free", "--gpus", "0", "--timeout", "1")  # piped: the result only
    assert r.returncode == 4 and "waiting for" not in r.stderr + r.stdout and "\x1b" not in r.stderr


def test_up_shows_the_servers_last_log_line_while_it_loads(sim_host, tmp_path, monkeypatch, cli):
    from gpuslate.units.store import UnitStore
    from gpuslate.units.unit import load_units
    from helpers import kill_leftovers

    monkeypatch.setenv("GPUSLATE_LOCK_DIR", str(tmp_path / "locks"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        code, shown, _ = on_pty(["up", "slow", "--gpus", "0", "--port", str(port), "--engine", "sglang", "--",
                                 sys.executable, "-m", "gpuslate", "sim", "serve", "--port", str(port),
                                 "--memory", "1GiB", "--startup-seconds", "2"], 160)
        assert code == 0, shown
        assert "slow: waiting until ready (sglang)" in shown and "of 15m00s" in shown
        assert "[sim-serve] loading weights of sim-model" in shown  # the server's own last line, as it goes
        assert "Unit slow ready in" in shown
        r = cli("down", "slow")
        assert r.returncode == 0, r.stderr
        assert "waiting" not in r.stderr  # piped
    finally:
        kill_leftovers(sim_host, load_units(UnitStore(tmp_path / "state")))
