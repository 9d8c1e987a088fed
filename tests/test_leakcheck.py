"""The suite's own check that every process a test starts is ended (tests/leakcheck.py), proved on
a small suite of its own run by a real pytest, under xdist: a test that leaves a process running
fails at its teardown, naming itself and the command; what a module fixture leaves, and a process
that wrote over its environment (a setproctitle title), fail the run at its end; every one of them is
killed; a tidy suite, with a process that takes a while to go, passes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from helpers import is_gone, wait_for

pytestmark = pytest.mark.slow  # two pytest runs of their own

TESTS = Path(__file__).resolve().parent

LEAKY = '''
import subprocess, sys, pytest

@pytest.fixture(scope="module")
def daemon():
    yield subprocess.Popen(["sleep", "{t}1"], start_new_session=True)  # never ended

def test_leaks():
    subprocess.Popen(["sleep", "{t}2"], start_new_session=True)

def test_titled(tmp_path):
    code = "import setproctitle, time; setproctitle.setproctitle('leaky-{t}3'); time.sleep(300)"
    subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, start_new_session=True)

def test_uses_the_daemon(daemon):
    assert daemon.poll() is None
'''

TIDY = '''
import signal, subprocess, sys, pytest

SLOW_TO_GO = "import signal, time; signal.signal(signal.SIGTERM, lambda *a: (time.sleep(0.5), exit())); time.sleep(300)"

@pytest.fixture
def server():
    p = subprocess.Popen([sys.executable, "-c", SLOW_TO_GO], start_new_session=True)
    yield p
    p.terminate()  # it takes half a second to go, after this finalizer returned: not a leftover

def test_ended(server):
    p = subprocess.Popen(["sleep", "{t}4"])
    p.kill()
    p.wait()
'''


HANGS = '''
import subprocess, time

def test_hangs():
    subprocess.Popen(["sleep", "{t}5"], start_new_session=True)
    time.sleep(300)  # until the run is terminated
'''


def _sub_command(folder: Path, *args: str) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of a small suite's own pytest in ``folder``, with the plugin."""
    (folder / "pytest.ini").write_text("[pytest]\n")
    # CI and BUILD_NUMBER left out: on CI, pytest's short summary repeats each failure's whole message (a
    # leftover's PID line again); the small suite's output is the same wherever the suite runs
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "BUILD_NUMBER")}
    env.update(PYTHONPATH=str(TESTS), GPUSLATE_TEST_SETTLE="1", PYTHONDONTWRITEBYTECODE="1")
    return [sys.executable, "-m", "pytest", "-p", "leakcheck", "-p", "no:cacheprovider", "-q",
            "--rootdir", str(folder), "-c", str(folder / "pytest.ini"), *args], env


def sub_pytest(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv, env = _sub_command(folder, *args)
    return subprocess.run(argv, cwd=folder, capture_output=True, text=True, env=env, timeout=120)


def pids_naming(token: str) -> list[int]:
    """Every process whose command names ``token``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if token.encode() in cmd:
            found.append(int(name))
    return found


def kill_token(token: str) -> None:
    """The test's own cleanup, whatever the plugin did: every process whose command names ``token``."""
    for pid in pids_naming(token):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_leftovers_are_named_killed_and_fail_the_run(tmp_path: Path) -> None:
    token = str(uuid.uuid4().int % 10**8 + 10**8)  # sleep durations no other process uses
    (tmp_path / "test_leaky.py").write_text(LEAKY.replace("{t}", token))
    try:
        r = sub_pytest(tmp_path, "-n", "2", "test_leaky.py")
        out = r.stdout + r.stderr
        assert r.returncode == 1, out
        # the test that leaked fails at its teardown, naming itself and the command
        assert "ERROR test_leaky.py::test_leaks" in out
        assert f"started by test_leaky.py::test_leaks: sleep {token}2" in out
        # the run's end: the module fixture's process, with the test it was set up for; the titled
        # process by the test folder it works in
        assert "2 process(es) left running by the tests (killed now)" in out, out
        assert f"module fixture daemon, set up for test_leaky.py::test_uses_the_daemon: sleep {token}1" in out
        assert re.search(rf"started by the test whose folder it uses \(\S*test_titled\S*\): leaky-{token}3", out), out
        pids = [int(p) for p in re.findall(r"PID (\d+), started by", out)]
        assert len(pids) == 3 and all(is_gone(p) for p in pids), out
    finally:
        kill_token(token)


@pytest.mark.parametrize("workers", [[], ["-n", "2"]])
def test_a_run_terminated_ends_what_its_tests_started(tmp_path: Path, workers: list[str]) -> None:
    """SIGTERM to the run (``timeout``, a CI's cancel) ends it as Ctrl-C does, and what its tests
    started is ended with it: left to SIGTERM's default, a hung GPU test's holder outlived the run."""
    token = str(uuid.uuid4().int % 10**8 + 10**8)
    (tmp_path / "test_hangs.py").write_text(HANGS.replace("{t}", token))
    argv, env = _sub_command(tmp_path, *workers, "test_hangs.py")
    proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    sleeper = f"{token}5"
    try:
        wait_for(lambda: pids_naming(sleeper) != [] or proc.poll() is not None, timeout=60)
        started = pids_naming(sleeper)
        assert len(started) == 1 and proc.poll() is None, proc.poll()
        proc.terminate()
        out, _ = proc.communicate(timeout=60)
        # interrupted as by Ctrl-C, and failed: the test's process was left, named, and killed
        assert proc.returncode == 1 and "KeyboardInterrupt: signal 15" in out, out
        assert is_gone(started[0]), out
        assert f"started by test_hangs.py::test_hangs: sleep {token}5" in out, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        kill_token(token)


def test_a_tidy_suite_passes(tmp_path: Path) -> None:
    token = str(uuid.uuid4().int % 10**8 + 10**8)
    (tmp_path / "test_tidy.py").write_text(TIDY.replace("{t}", token))
    try:
        r = sub_pytest(tmp_path, "test_tidy.py")
        assert r.returncode == 0 and "left running" not in r.stdout, r.stdout + r.stderr
    finally:
        kill_token(token)


def test_a_child_whose_environment_reads_empty_is_awaited_then_spared() -> None:
    """Popen returns once the child's exec closed its close-on-exec pipe, before the kernel shows the
    child's environment (its markers; about 1 read in 100 right after a Popen finds it empty here): a
    child of the test's whose environment reads empty is taken as one still in its exec, awaited (so
    that a teardown right after a Popen finds it), and, still empty at the end of the wait (``env={}``
    here: for good), neither named nor ended: without its marker nothing proves it is the test's."""
    import leakcheck  # lazy: startup (a plugin module, imported by conftest.py before any test)

    run, node = os.environ[leakcheck.RUN], os.environ[leakcheck.NODE]
    p = subprocess.Popen(["/bin/sleep", "300"], env={}, start_new_session=True)
    try:
        starting: list[int] = []
        assert p.pid not in {x.pid for x in leakcheck.find(run, node, (), starting)}
        assert starting == [p.pid]
        t0 = time.monotonic()
        assert leakcheck.known(run, node, timeout=0.5) == [] and time.monotonic() - t0 >= 0.5
        assert leakcheck.settle(run, node, timeout=0.5) == [] and p.poll() is None
    finally:
        p.kill()
        p.wait()
    # gone (reaped): nothing left to await
    t0 = time.monotonic()
    assert leakcheck.known(run, node, timeout=30) == [] and time.monotonic() - t0 < 5
