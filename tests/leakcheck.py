"""Every process a test starts is ended, also when the test fails: a pytest plugin (registered in
conftest.py) that finds what a test left running, ends it and fails the run naming the test.

How a process is known to be the run's: the controller (or the one process, without xdist) puts
``GPUSLATE_TEST_RUN=<uuid>`` in ``os.environ`` in ``pytest_configure``, before xdist starts its
workers, which inherit it; while a test runs (its setup, call and teardown), ``GPUSLATE_TEST_NODE``
names it (``tests/x.py::test_y``), and while a fixture of a wider scope is set up, that fixture
(``module fixture other_user, set up for tests/x.py::test_y``). Every process started meanwhile
inherits both (``helpers.gpuslate_env`` copies ``os.environ``), and ``/proc/PID/environ`` keeps
what a process was started with, whatever it sets later.

- After each test's teardown (every fixture finalizer has run), a process still carrying this run
  and exactly this test is left over: the check awaits, for a few seconds, those that are
  still going away, then SIGKILLs the rest and fails the test's teardown, naming each with its
  command.
- At the end of the session (session fixtures torn down; under xdist, in the controller once every
  worker is done), the same for anything of the run: what a fixture of a wider scope left, what
  escaped the per-test check. The run fails, each leftover named with its test.

A process is known by its marker only once its ``execve`` has laid out its new environment:
before that ``/proc/PID/environ`` reads empty, and ``subprocess.Popen`` returns a little earlier
(when the exec closed its close-on-exec pipe), so a test that ends right after a Popen may leave its
child there, more often on a loaded machine. A child of this process or of the run's whose
environment reads empty is therefore awaited (for the same few seconds) before a check concludes.

Signals go through a pidfd opened before the marker is read again: the marker, read from the
process the pidfd holds, is the proof that it is ours (a pid reused meanwhile is never signaled).
Never this process or its ancestors (a pytest started by a test carries its test's marker).

A process whose environment is gone is not found by its marker: one started with an environment
of the test's own making (``env={...}`` without ``os.environ``), or one that wrote over its
``/proc/PID/environ`` (py-setproctitle's title without ``SPT_NOENV``: ``sim hold --title``). For
those, the session check also takes any process with a file or working folder under the run's
``--basetemp`` (a simulated host's holder keeps its allocation record open there).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

RUN = "GPUSLATE_TEST_RUN"
NODE = "GPUSLATE_TEST_NODE"
#: how long processes still going away (signaled by a finalizer, a zombie's parent reaping it)
#: may take before they count as left running (``GPUSLATE_TEST_SETTLE``: another, for the test of
#: this plugin)
SETTLE_SECONDS = float(os.environ.get("GPUSLATE_TEST_SETTLE", "5"))
_MAX_ENVIRON = 1 << 20


class Leftover:
    """A process left running (a plain object: the terminal's statistics hold it beside reports)."""

    def __init__(self, pid: int, node: str, command: str) -> None:
        self.pid = pid
        self.node = node  # the test (or wider fixture) it was started for
        self.command = command


def _raw_environ(pid: int) -> bytes | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read(_MAX_ENVIRON)
    except OSError:  # gone, or not ours to read
        return None


def _environ(pid: int, raw: bytes | None = None) -> dict[bytes, bytes] | None:
    raw = _raw_environ(pid) if raw is None else raw
    if raw is None:
        return None
    out: dict[bytes, bytes] = {}
    for item in raw.split(b"\0"):
        key, eq, value = item.partition(b"=")
        if eq and key in (RUN.encode(), NODE.encode()):
            out[key] = value
    return out


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read(4096)
    except OSError:
        return "?"
    return raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")[:300] or "?"


def _protected() -> set[int]:
    """This process and its ancestors."""
    out = {os.getpid()}
    pid = os.getpid()
    while pid > 1:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                pid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        out.add(pid)
    return out


def _pids() -> Iterator[int]:
    for name in os.listdir("/proc"):
        if name.isdigit():
            yield int(name)


def _machinery(env: dict[bytes, bytes] | None, run: str) -> bool:
    """The run's own processes, started before any test (an xdist worker)."""
    return env is not None and env.get(RUN.encode()) == run.encode() and NODE.encode() not in env


def _is_ours(pid: int, run: str, node: str | None, env: dict[bytes, bytes] | None = None) -> str | None:
    """The node a live process of the run was started for (``node`` given: only that one)."""
    env = _environ(pid) if env is None else env
    if not env or env.get(RUN.encode()) != run.encode() or NODE.encode() not in env:
        return None
    text = env[NODE.encode()].decode(errors="replace")
    return text if node is None or text == node else None


def _starting(pid: int, run: str, node: str | None, skip: set[int]) -> bool:
    """Whether ``pid``, whose environment reads empty, is a child of this process or of a process of
    the run (of ``node``) that is still in its ``execve``: the kernel shows the environment only once
    it has laid out the new stack (``mm->env_end`` set), after it closed the close-on-exec pipe that
    ``subprocess.Popen`` returns on; a test that ends right after a Popen has its child there."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state, ppid = f.read().rsplit(b")", 1)[1].split()[:2]
    except (OSError, ValueError):
        return False
    if state in (b"Z", b"X"):  # a zombie's environment reads empty too, for good
        return False
    return int(ppid) in skip or _is_ours(int(ppid), run, node) is not None


def _under(pid: int, roots: tuple[str, ...]) -> str | None:
    """The process's working folder or open file under one of ``roots`` (its test's folder names
    the test), if it has one."""
    if not roots:
        return None
    try:
        paths = [os.readlink(f"/proc/{pid}/cwd")]
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for fd in fds:
        with contextlib.suppress(OSError):
            paths.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return next((p for p in paths for r in roots if p == r or p.startswith(r + "/")), None)


def find(run: str, node: str | None = None, roots: tuple[str, ...] = (),
         starting: list[int] | None = None) -> list[Leftover]:
    """Live processes of the run (of its test ``node`` only, when given; or, with ``roots``, any
    process with a file under them). ``starting``: gets the processes not known yet, a child of the
    run's still in its exec (see :func:`_starting`)."""
    skip = _protected()
    out = []
    for pid in _pids():
        if pid in skip:
            continue
        raw = _raw_environ(pid)
        env = _environ(pid, raw)
        got = _is_ours(pid, run, node, env)
        if got is None and node is None and roots and not _machinery(env, run):
            path = _under(pid, roots)
            got = None if path is None else f"the test whose folder it uses ({path})"
        if got is None and starting is not None and raw == b"" and _starting(pid, run, node, skip):
            starting.append(pid)
        if got is not None:
            out.append(Leftover(pid, got, _command(pid)))
    return out


def settle(run: str, node: str | None, roots: tuple[str, ...] = (), timeout: float = SETTLE_SECONDS,
           ) -> list[Leftover]:
    """What is still there after up to ``timeout`` seconds of it going away (awaited, not slept), once
    every process still in its exec is known."""
    deadline = time.monotonic() + timeout
    while True:
        starting: list[int] = []
        found = find(run, node, roots, starting)
        if not (found or starting) or time.monotonic() >= deadline:
            return found
        time.sleep(0.05)


def known(run: str, node: str | None, timeout: float = SETTLE_SECONDS) -> list[Leftover]:
    """The run's live processes (of ``node``), once every one still in its exec is known (up to
    ``timeout``): what a finalizer ends now."""
    deadline = time.monotonic() + timeout
    while True:
        starting: list[int] = []
        found = find(run, node, (), starting)
        if not starting or time.monotonic() >= deadline:
            return found
        time.sleep(0.01)


def end(left: list[Leftover], run: str, roots: tuple[str, ...] = ()) -> None:
    """SIGKILL each leftover through a pidfd, once the process the pidfd holds has shown again
    that it is the run's."""
    for item in left:
        try:
            fd = os.pidfd_open(item.pid)
        except OSError:  # gone meanwhile
            continue
        try:
            ours = _is_ours(item.pid, run, item.node) is not None or \
                (not _machinery(_environ(item.pid), run) and _under(item.pid, roots) is not None)
            if ours:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
        finally:
            os.close(fd)


def describe(left: list[Leftover]) -> list[str]:
    return [f"PID {x.pid}, started by {x.node}: {x.command}" for x in left]


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    # a run ended by SIGTERM (``timeout``, a CI's cancel) ends as one interrupted by Ctrl-C: the running
    # test's finalizers and the run's end (which ends what the tests left) run, where SIGTERM's default
    # would leave every process the tests started (a GPU test's second-user holder, seen on an H100)
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupted)
    if not hasattr(config, "workerinput"):  # the controller, or the one process: before any worker
        os.environ[RUN] = uuid.uuid4().hex
        # a pytest started by a test of another run: that test is not this run's, and the workers
        # this run starts (before any test of its own) must not pass for that test's processes
        os.environ.pop(NODE, None)


@contextlib.contextmanager
def _tagged(value: str) -> Iterator[None]:
    before = os.environ.get(NODE)
    os.environ[NODE] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(NODE, None)
        else:
            os.environ[NODE] = before


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    with _tagged(item.nodeid):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: Any, request: pytest.FixtureRequest) -> Iterator[object]:
    if fixturedef.scope == "function":
        return (yield)
    node = os.environ.get(NODE, "?")
    with _tagged(f"{fixturedef.scope} fixture {fixturedef.argname}, set up for {node}"):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    result = yield  # every finalizer of the test has run
    run = os.environ.get(RUN)
    if run:
        left = settle(run, item.nodeid)
        if left:
            end(left, run)
            pytest.fail(f"{len(left)} process(es) this test started were still running after its teardown "
                        "(killed now; end them in a fixture finalizer):\n  " + "\n  ".join(describe(left)),
                        pytrace=False)
    return result


def _basetemp(config: pytest.Config) -> tuple[str, ...]:
    factory = getattr(config, "_tmp_path_factory", None)
    given = getattr(factory, "_given_basetemp", None) or getattr(factory, "_basetemp", None)
    return (str(Path(given).resolve()),) if given else ()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    run = os.environ.get(RUN)
    if hasattr(config, "workerinput") or not run:
        return
    roots = _basetemp(config)
    left = settle(run, None, roots)
    if not left:
        return
    end(left, run, roots)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write("\n")
        reporter.write_sep("=", f"{len(left)} process(es) left running by the tests (killed now)", red=True)
        for line in describe(left):
            reporter.write_line(line)
        reporter.stats.setdefault("left running", []).extend(left)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
