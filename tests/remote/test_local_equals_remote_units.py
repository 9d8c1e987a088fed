"""The compose-like unit commands over ``--host`` print what they print on the host itself: ``up``
and ``down`` of every unit of a file, ``restart``, ``rm``, ``ps -a`` and ``logs --timestamps
--since``; and ``RemoteHost.restart``/``rm``/``ps`` return what ``Host``'s return. Each runs here
against h1's simulated host and over ``--host h1`` (a real sshd on loopback), as in
test_local_equals_remote.py."""

from __future__ import annotations

import json
import re
import shutil
import sys

import pytest

from gpuslate import Host, PsOptions, RemoteHost
from gpuslate.units.remove import RmResult
from gpuslate.units.restart import RestartResult, RestartStatus
from test_local_equals_remote import Pair, _same, _shape, _stable

pytestmark = pytest.mark.ssh


@pytest.fixture
def pair(lab, fleet, tmp_path):
    h1 = lab.hosts["h1"]
    units = tmp_path / "units.toml"  # the same path here and there: h1 is this machine
    text = ""
    for gpu, name in enumerate(("a", "b")):
        cmd = [sys.executable, "-m", "gpuslate", "sim", "hold", "--gpus", str(gpu), "--memory", "1GiB"]
        text += f'[units.{name}]\ncommand = {json.dumps(cmd)}\ngpus = "{gpu}"\nready_log = "ready"\ngrace = 2\n\n'
    units.write_text(text)
    p = Pair(h1, fleet)
    yield p, str(units)
    p.local("down", "--config", str(units))
    shutil.rmtree(h1.state_dir / "units", ignore_errors=True)  # the next tests find h1 without units


def _contained(text: str) -> str:
    """:func:`_shape`, and without the containment a unit got: a cgroup where one could be made, else its
    session (with other test files running beside this one, the two runs may not get the same)."""
    return re.sub(r"(port \S+), (cgroup|session)\b", r"\1, CONTAINMENT", _shape(text))


def test_compose_like_commands_print_the_same(pair):
    p, units = pair

    def twice(args: tuple[str, ...], between: tuple[str, ...]) -> None:
        """ARGS here, then BETWEEN (the state back as it was), then ARGS over --host."""
        local = p.local(*args)
        r = p.local(*between)
        assert r.returncode == 0, r.stdout + r.stderr
        _same(local, p.remote(*args), _contained)

    twice(("up", "--config", units), ("down", "--config", units))  # every unit of the file
    for args in (("ps",), ("logs", "a", "--timestamps"), ("logs", "b", "--since", "1h", "-n", "1")):
        _same(p.local(*args), p.remote(*args), _stable)  # the same state: byte for byte
    twice(("restart", "a"), ("ps",))
    twice(("down", "a", "b"), ("up", "a", "b", "--config", units))
    local = p.local("rm", "a", "b")
    for again in (("up", "a", "b", "--config", units), ("down", "a", "b")):  # the records back, stopped
        assert p.local(*again).returncode == 0
    _same(local, p.remote("rm", "a", "b"), lambda t: re.sub(r"\d+ files", "N files", _shape(t)))
    bad = ("rm", "nope")  # no document: the same error and code
    local, remote = p.local(*bad), p.remote(*bad)
    assert local.returncode == remote.returncode == 2
    assert local.stderr.removeprefix("gpuslate: error: ").splitlines()[0] in remote.stdout
    _same(p.local("ps", "-a"), p.remote("ps", "-a"), _stable)


def test_remote_host_restart_rm_and_ps_return_what_host_returns(pair, lab, monkeypatch):
    p, units = pair
    for key, value in lab.client_env().items():
        monkeypatch.setenv(key, value)
    assert p.local("up", "--config", units).returncode == 0
    remote = RemoteHost("h1")
    res = remote.restart("a")
    assert isinstance(res, RestartResult) and res.status is RestartStatus.RESTARTED, res.to_json()
    assert p.local("down", "a").returncode == 0
    gone = remote.rm(["a"])
    assert isinstance(gone, RmResult) and [u.name for u in gone.units] == ["a"]
    here = Host.open(str(p.host.sim.root))
    monkeypatch.setenv("GPUSLATE_STATE_DIR", str(p.host.state_dir))
    listed, mine = remote.ps(PsOptions(all=False)), here.ps(PsOptions(all=False))
    assert [u.unit.name for u in listed.units] == [u.unit.name for u in mine.units] == ["b"]
    assert listed.hidden == mine.hidden == 0
