"""Shared fixtures: simulated hosts, real holder processes, the CLI as a subprocess.

Every process a test starts is its own session, so teardown can kill exactly
what the test started (and nothing else) by process group; what a test leaves running anyway is
found, ended and named by the plugin in leakcheck.py, which fails the run.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from gpuslate.gpu.simhost.host import SimHost
from helpers import GiB, Holder, gpuslate_env, program_named, run_cli
from otheruser import other_user, shared_host  # noqa: F401  (fixtures for the tests across users)

pytest_plugins = ["leakcheck"]  # every process a test starts is ended: see leakcheck.py

# Started in the background by a shell without job control (`pytest ... &` in a script, CI runners),
# pytest inherits SIGINT ignored, and so would every process a test starts: the tests of Ctrl-C
# would send it to processes that never see it. Python's own handler here: a child starts with the
# default, as under a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# The properties are of logic, not of speed: an example that took 269 ms on a loaded machine is no
# failure (hypothesis's default deadline, 200 ms, made the suite fail beside other work).
settings.register_profile("gpuslate", deadline=None)
settings.load_profile("gpuslate")


def pytest_configure(config: pytest.Config) -> None:
    """Once per run, before any worker starts: gpuslate's modules compiled to bytecode, as pip does on
    an install. The tests start thousands of gpuslate processes, and where ``PYTHONDONTWRITEBYTECODE``
    is set (or on a fresh clone, before the first) each would compile every module it imports
    again: 60 ms more for a ``status``, measured; compileall writes the files whatever that says."""
    if hasattr(config, "workerinput"):
        return
    import compileall  # lazy: only the controller

    compileall.compile_dir(str(Path(__file__).resolve().parents[1] / "src" / "gpuslate"), quiet=1)


@pytest.fixture(autouse=True)
def measured_first(request: pytest.FixtureRequest) -> Iterator[None]:
    """A ``timing`` test measures gpuslate, not the machine's other work: it runs (with every process it
    starts, which inherits it) at a higher scheduling priority than that work, nice -10, where this
    user may raise it (root, CAP_SYS_NICE), as a benchmark is run; elsewhere as it is."""
    if request.node.get_closest_marker("timing") is None:
        yield
        return
    before = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, min(before, -10))
    except PermissionError:
        yield
        return
    try:
        yield
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, before)  # back down: always allowed


@pytest.fixture
def sim_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimHost:
    host = SimHost.init(tmp_path / "simhost", gpus=8, memory=96 * GiB, release_delay=0.2)
    monkeypatch.setenv("GPUSLATE_SIM", str(host.root))
    monkeypatch.setenv("GPUSLATE_STATE_DIR", str(tmp_path / "state"))
    return host


@pytest.fixture
def hold(sim_host: SimHost) -> Iterator[Callable[..., Holder]]:
    """Start ``gpuslate sim hold ARGS`` (or another ``sim`` verb) as a real process tree; wait for its
    ready line."""
    started: list[Holder] = []

    def start(*args: str, new_session: bool = True, host: SimHost | None = None,
              program: str | None = None, verb: str = "hold", env: dict[str, str | None] | None = None) -> Holder:
        """``program``: run the holder as that program (its /proc/PID/exe), not only titled so;
        ``verb="mps"``: ``gpuslate sim mps ARGS``, a simulated MPS server; ``env``: variables set
        first in its environment (``None``: left out)."""
        root = (host or sim_host).root
        exe = program_named(program, sim_host.root.parent / "programs") if program else sys.executable
        environ = gpuslate_env()
        first = {k: v for k, v in (env or {}).items() if v is not None}
        environ = {**first, **{k: v for k, v in environ.items() if k not in (env or {})}}
        proc = subprocess.Popen(
            [exe, "-m", "gpuslate", "--sim", str(root), "sim", verb, *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=environ, start_new_session=new_session,
        )
        ready, _, _ = select.select([proc.stdout], [], [], 20)
        line = proc.stdout.readline() if ready else ""
        if not line:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL) if new_session else proc.kill()
            proc.wait()
            raise AssertionError(f"holder did not become ready: {proc.stderr.read()}")
        h = Holder(proc, json.loads(line))
        started.append(h)
        return h

    yield start
    for h in started:
        h.kill()
        try:
            h.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass


@pytest.fixture
def cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    return run_cli
