"""``RemoteHost``: the verbs of ``Host`` over a real sshd on loopback, returning the same result types.

Each verb runs against h1 (its own simulated host) through ``gpuslate.RemoteHost`` and, where the
state allows, through a local ``gpuslate.Host`` on the same simulated host: the two results are the
same type with the same facts. What cannot cross the wire (a ``confirm`` callback, an explicit
prefetch list) is refused before anything runs.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from gpuslate import ClearOptions, Host, RemoteHost, Selection, UnitSpec, UpOptions, UsageError, WaitOptions
from gpuslate.clearing.clear import ClearResult, ClearStatus
from gpuslate.errors import GpuslateError
from gpuslate.options import ClearLine, UpLine
from gpuslate.remote.host import unit_flags
from gpuslate.units.lifecycle import DownStatus, UpStatus
from gpuslate.units.listing import PsResult
from gpuslate.verbs import CLEAR, UP
from helpers import gpuslate_env, is_gone, wait_for
from sshd_hosts import free_port

pytestmark = pytest.mark.ssh


@pytest.fixture
def h1(lab, monkeypatch):
    """h1, with this process's environment set up as a client of the lab (and as h1 for a local Host)."""
    host = lab.hosts["h1"]
    for key, value in {**lab.client_env(), **host.env}.items():
        monkeypatch.setenv(key, value)
    yield host
    shutil.rmtree(host.state_dir / "units", ignore_errors=True)  # the next tests find h1 without units


def _facts(snap) -> list[tuple[int, int | None, list[int]]]:
    return [(g.index, g.reading.memory.used if g.reading.memory else None, sorted(p.pid for p in g.processes))
            for g in snap.gpus]


def test_status_and_clear_return_what_a_local_host_returns(h1, hold):
    held = hold("--memory", "3GiB", "--gpus", "0-1", "--workers", "2", host=h1.sim)
    remote, local = RemoteHost("h1"), Host.open(str(h1.sim.root))
    r, here = remote.status(), local.status()
    assert type(r) is type(here) and r.host == here.host
    assert _facts(r) == _facts(here) and any(pids for _, _, pids in _facts(r))
    assert _facts(remote.status([1])) == _facts(local.status([1]))

    sel = Selection(gpus=(0, 1))
    plan_there = remote.clear(sel, ClearOptions(dry_run=True))
    plan_here = local.clear(sel, ClearOptions(dry_run=True))
    assert isinstance(plan_there, ClearResult) and plan_there.status is ClearStatus.DRY_RUN
    assert sorted(t.ident.pid for t in plan_there.plan.targets) == sorted(t.ident.pid for t in plan_here.plan.targets)
    assert held.pid in {t.ident.pid for t in plan_there.plan.targets}

    with pytest.raises(UsageError, match="confirmation"):  # refused here: nothing ran there
        remote.clear(sel, ClearOptions(confirm=lambda plan: True))
    assert not is_gone(held.pid)

    done = remote.clear(sel, ClearOptions(grace=2))
    assert done.status is ClearStatus.CLEAN, done.to_json()
    wait_for(lambda: is_gone(held.pid))
    assert remote.wait([0, 1], WaitOptions(timeout=5)).ok


def test_units_up_ps_down_over_ssh(h1):
    port = free_port()
    spec = UnitSpec("r", command=[sys.executable, "-m", "gpuslate", "sim", "serve", "--port", str(port),
                                  "--startup-seconds", "0.1", "--memory", "2GiB"],
                    gpus=[0], port=port, engine="sglang", env={"FLAG": "-x y"})
    remote = RemoteHost("h1")
    try:
        up = remote.up(spec, UpOptions())
        assert up.status is UpStatus.READY, up.to_json()
        assert up.record.gpus == [0] and up.record.port == port
        listed = remote.ps()
        assert isinstance(listed, PsResult) and [u.unit.name for u in listed.units] == ["r"]
        here = Host.open(str(h1.sim.root)).ps()
        assert [{k: v for k, v in u.items() if k != "uptime_s"} for u in listed.to_json()["units"]] == \
               [{k: v for k, v in u.items() if k != "uptime_s"} for u in here.to_json()["units"]]
        down = remote.down("r")
        assert down.status is DownStatus.STOPPED, down.to_json()
        assert remote.wait([0], WaitOptions(timeout=5)).ok
    finally:
        subprocess.run([sys.executable, "-m", "gpuslate", "down", "r"], env=gpuslate_env(h1.env),
                       capture_output=True, timeout=60, check=False)


def test_a_transport_failure_is_raised_by_name(lab, monkeypatch):
    for key, value in lab.client_env().items():
        monkeypatch.setenv(key, value)
    with pytest.raises(GpuslateError) as failed:
        RemoteHost("down").status()
    assert failed.value.code == "unreachable", failed.value


def test_the_command_lines_keep_values_that_look_like_options():
    words = CLEAR.command(ClearLine(selection=Selection(gpus=(0, 2, 3), pids=(7,), user="-bob", match="--yes"),
                                    options=ClearOptions(grace=1)), yes=True)
    assert "--yes" in words
    assert "--match=--yes" in words and "--user=-bob" in words and "--gpus=0,2-3" in words

    def up_words(spec: UnitSpec, options: UpOptions) -> list[str]:
        return UP.command(UpLine(names=(spec.name,), unit=unit_flags(spec), options=options,
                                 command=tuple(spec.command)))

    spec = UnitSpec("u", command=["serve", "--port", "1"], port=1, model="-m")
    assert up_words(spec, UpOptions(clear_first=True))[-4:] == ["--", "serve", "--port", "1"]
    assert "--model=-m" in up_words(spec, UpOptions())
    with pytest.raises(UsageError, match="prefetch"):
        RemoteHost("h1").up(UnitSpec("u", command=["serve"], port=1, prefetch=["/w"]))
