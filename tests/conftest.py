"""Shared fixtures: simulated hosts, real holder processes, the CLI as a subprocess.

Every process a test starts is its own session, so teardown can kill exactly
what the test started (and nothing else) by process group.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuslate.gpu.simhost.host import SimHost
from helpers import GiB, Holder, gpuslate_env, program_named, run_cli
from otheruser import other_user, shared_host  # noqa: F401  (fixtures for the tests across users)


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
            proc.kill()
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
