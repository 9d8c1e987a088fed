"""Output that cannot crash the run (issue 25, cli/render/output.py): a closed stdout, a reader gone, a full
disk. Commands that only print exit 141 quietly; commands that act finish their work and audit and
exit with their own code; never a traceback. Real processes: the CLI as the console script runs it,
its stdout closed (``>&-``), a pipe whose reader is already gone, or /dev/full."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from gpuslate.cli.render import output
from helpers import gpuslate_env, is_gone

SHAPES = ("closed", "gone", "full")


def run_broken(args: list[str], shape: str, *, stderr: str = "pipe", timeout: float = 60) -> tuple[int, str]:
    """``gpuslate ARGS`` with its stdout closed, a pipe without reader, or /dev/full; (exit code, stderr)."""
    argv = [sys.executable, "-m", "gpuslate", *args]
    err_to = subprocess.PIPE if stderr == "pipe" else subprocess.DEVNULL
    if shape == "closed":
        p = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", *argv], stderr=err_to, text=True,
                           env=gpuslate_env(), timeout=timeout, stdin=subprocess.DEVNULL)
    elif shape == "gone":
        r, w = os.pipe()
        os.close(r)  # the reader went away before the first byte: every write is EPIPE
        try:
            p = subprocess.run(argv, stdout=w, stderr=err_to, text=True, env=gpuslate_env(), timeout=timeout,
                               stdin=subprocess.DEVNULL)
        finally:
            os.close(w)
    else:
        with open("/dev/full", "w") as full:
            p = subprocess.run(argv, stdout=full, stderr=err_to, text=True, env=gpuslate_env(), timeout=timeout,
                               stdin=subprocess.DEVNULL)
    return p.returncode, p.stderr or ""


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("args", [["status"], ["status", "--json"], ["audit"], ["ps"], ["clear", "--dry-run"],
                                  ["wait", "--free", "--json"], ["sim", "hold", "--help"], ["--help"], ["--version"],
                                  ["status", "--watch", "0.1"], ["status", "--json", "--watch", "0.1"]],
                         ids=" ".join)
def test_commands_that_only_print_exit_141_quietly(sim_host, args, shape):
    code, err = run_broken(args, shape)
    assert code == output.LOST_STATUS, err
    assert err == "", err  # quiet: no traceback, no message


@pytest.mark.parametrize("shape", SHAPES)
def test_clear_finishes_its_work_and_audit_with_its_own_code(sim_host, hold, cli, shape):
    victim = hold("--gpus", "0", "--memory", "1GiB")
    code, err = run_broken(["clear", "--yes", "--gpus", "0", "--grace", "2"], shape)
    assert code == 0 and "Traceback" not in err, err
    assert is_gone(victim.pid)
    audit = json.loads(cli("audit", "--json").stdout)
    assert any(e["target"]["pid"] == victim.pid for e in audit["entries"] if e["event"] == "signal"), audit


@pytest.mark.parametrize("shape", ["closed", "gone"])
def test_rm_acts_its_work_done_and_its_own_code(sim_host, cli, shape):
    """rm acts (it removes a unit's record and logs): with its output gone it exits with its own code,
    as clear does, not 141 as a command that only prints."""
    r = cli("up", "web", "--ready-log", "never", "--", sys.executable, "-c", "pass")  # exits first: failed
    assert r.returncode == 6, r.stderr
    code, err = run_broken(["rm", "web"], shape)
    assert code == 0 and "Traceback" not in err, err
    assert json.loads(cli("ps", "-a", "--json").stdout)["units"] == []


def test_sim_leak_with_stdout_closed_is_recorded(sim_host):
    code, err = run_broken(["sim", "leak", "--gpu", "3", "--memory", "1GiB", "--json"], "closed")
    assert code == 0, err
    assert [r.gpu for r in sim_host.records()] == [3]


@pytest.mark.parametrize("stderr_shape", ["closed", "gone"])
def test_an_error_that_cannot_be_shown_keeps_its_exit_code(tmp_path, stderr_shape):
    argv = [sys.executable, "-m", "gpuslate", "--sim", str(tmp_path / "none"), "status"]
    if stderr_shape == "closed":
        p = subprocess.run(["sh", "-c", 'exec "$@" 2>&-', "sh", *argv], capture_output=True, text=True,
                           env=gpuslate_env(), timeout=60)
    else:
        r, w = os.pipe()
        os.close(r)
        try:
            p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=w, text=True, env=gpuslate_env(), timeout=60)
        finally:
            os.close(w)
    assert p.returncode == 3 and p.stdout == ""


def test_a_lost_stderr_changes_nothing_for_a_command_that_prints(sim_host):
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run([sys.executable, "-m", "gpuslate", "status", "--json"], stdout=subprocess.PIPE, stderr=w,
                           text=True, env=gpuslate_env(), timeout=60)
    finally:
        os.close(w)
    assert p.returncode == 0 and json.loads(p.stdout)["schema"] == "gpuslate.status.v1"


def test_a_closed_stdin_is_no_terminal(sim_host, hold):
    """``clear <&-`` is a clear without a terminal: silence is no consent (exit 2, nothing signaled),
    never an AttributeError on Python's ``sys.stdin = None``; with --yes it runs."""
    victim = hold("--gpus", "1", "--memory", "1GiB")
    argv = ["sh", "-c", 'exec "$@" <&-', "sh", sys.executable, "-m", "gpuslate", "clear", "--gpus", "1", "--grace", "2"]
    p = subprocess.run(argv, capture_output=True, text=True, env=gpuslate_env(), timeout=60)
    assert "Traceback" not in p.stderr and p.returncode == 2 and "add --yes" in p.stderr, p.stderr
    assert not is_gone(victim.pid)
    p = subprocess.run([*argv, "--yes"], capture_output=True, text=True, env=gpuslate_env(), timeout=60)
    assert "Traceback" not in p.stderr and p.returncode == 0, p.stderr
    assert is_gone(victim.pid)


def test_closed_standard_descriptors_are_opened_on_dev_null():
    """A file opened next must not become 'stdout' (a server started then would write into it)."""
    code = ("import os, sys; from gpuslate.cli.render.output import open_standard_fds; open_standard_fds(); "
            "fd = os.open('/dev/null', os.O_RDONLY); sys.exit(0 if fd > 2 and all(os.path.samefile("
            "f'/proc/self/fd/{n}', '/dev/null') for n in (0, 1, 2)) else 1)")
    p = subprocess.run(["sh", "-c", 'exec "$@" <&- >&- 2>&-', "sh", sys.executable, "-c", code],
                       env=gpuslate_env(), timeout=30)
    assert p.returncode == 0


# -- the guard itself ----------------------------------------------------------------------------


class Broken(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


@pytest.fixture
def mode() -> Iterator[None]:
    yield
    output.set_mode(output.Mode.PRINT)


@pytest.mark.parametrize("mode_, name, raises", [
    (output.Mode.PRINT, "stdout", True), (output.Mode.PRINT, "stderr", False),
    (output.Mode.ACT, "stdout", False), (output.Mode.ACT, "stderr", False),
    (output.Mode.RUN, "stdout", True), (output.Mode.RUN, "stderr", True),
])
def test_a_stream_is_lost_once_and_raises_only_where_its_mode_stops(mode, mode_, name, raises):
    output.set_mode(mode_)
    s = output.GuardedStream(Broken(), name)
    if raises:
        with pytest.raises(output.OutputLost) as ei:
            s.write("x")
        assert ei.value.stream == name and "broken pipe" in str(ei.value)
    else:
        assert s.write("x") == 1
    assert s.write("more") == 4 and s.lost  # once lost: dropped, never raised again
    s.flush()


def test_quietly_and_other_threads_never_raise(mode):
    output.set_mode(output.Mode.RUN)
    s = output.GuardedStream(Broken(), "stderr")
    with output.quietly():
        s.write("an error being reported")
    assert s.lost
    t = output.GuardedStream(Broken(), "stdout")
    done: list[int] = []
    th = threading.Thread(target=lambda: done.append(t.write("from a thread")))
    th.start()
    th.join()
    assert done == [13] and t.lost
    with pytest.raises(output.OutputLost):  # the main thread's next write stops the run
        t.write("x")


def test_a_stream_closed_at_start_is_lost_at_its_first_write(mode):
    s = output.GuardedStream(None, "stdout")
    assert not s.isatty() and s.lost is None
    with pytest.raises(output.OutputLost, match="closed before gpuslate started"):
        print("x", file=s)  # type: ignore[arg-type]


def test_modes_by_command():
    from gpuslate.cli.commands import output_mode
    from gpuslate.cli.main import build_parser

    def mode_of(*words: str) -> output.Mode:
        return output_mode(words[0], build_parser(list(words)).parse_args(list(words)))

    assert mode_of("status") is mode_of("ps") is mode_of("audit") is mode_of("clear", "--dry-run") is output.Mode.PRINT
    assert mode_of("clear", "--yes") is mode_of("down", "web") is mode_of("swap", "a", "b") is output.Mode.ACT
    assert mode_of("slurm", "epilog") is mode_of("sim", "init", "d") is output.Mode.ACT
    assert mode_of("up", "web", "--", "serve", "--port", "1") is output.Mode.ACT  # up's own 'command' is a list
    assert mode_of("experiment", "run", "x.toml") is mode_of("demo") is output.Mode.RUN
    assert mode_of("experiment", "report", "d") is output.Mode.PRINT
    # restart and rm act: their work finishes and they exit with their own code (a table of acting
    # commands apart from the command table had left them out)
    assert mode_of("restart", "web") is mode_of("rm", "web") is mode_of("install", "--out", "x") is output.Mode.ACT
    assert mode_of("logs", "web") is mode_of("bench", "http://x") is mode_of("wait", "--free") is output.Mode.PRINT




def test_stdout_and_stderr_of_one_pipe_raise_once(mode):
    """``2>&1 | head``: both streams are the one pipe that went away. The first failed write stops the
    run (OutputLost); a write to the other stream during the cleanup it started must not cut it short."""
    output.set_mode(output.Mode.RUN)
    err, out = output.GuardedStream(Broken(), "stderr"), output.GuardedStream(Broken(), "stdout")
    with pytest.raises(output.OutputLost):
        err.write("progress\n")
    out.write("stopping the deployment\n")  # the cleanup's own output: dropped, not raised
    assert err.lost and out.lost
