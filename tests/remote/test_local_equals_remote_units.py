"""The compose-like unit commands over ``--host`` print what they print on the host itself: ``up``
and ``down`` of every unit of a file, ``restart``, ``rm``, ``ps -a`` and ``logs --timestamps
--since``; and ``RemoteHost.restart``/``rm``/``ps``/``up(name)``/``logs``/``audit`` return what
``Host``'s return. Each runs here against h1's simulated host and over ``--host h1`` (a real sshd on loopback), as in
test_local_equals_remote.py."""

from __future__ import annotations

import json
import re
import shutil
import sys

import pytest

from gpuslate import Host, PsOptions, RemoteHost, UnitSpec, UpOptions, UsageError
from gpuslate.host.auditlist import AuditListing, AuditOptions
from gpuslate.units.lifecycle import UpResult, UpStatus
from gpuslate.units.logfile import LogsOptions, LogsResult
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


def test_remote_host_up_by_name_logs_and_audit_return_what_host_returns(pair, lab, monkeypatch):
    """``up("a")`` resolves the unit from its last run (there as here), and ``logs``/``audit`` are the
    documents the host itself reads; what cannot be sent is refused before anything runs."""
    p, units = pair
    for key, value in lab.client_env().items():
        monkeypatch.setenv(key, value)
    assert p.local("up", "--config", units).returncode == 0
    assert p.local("down", "a", "b").returncode == 0  # the records stay: 'a' is known by its last run
    remote = RemoteHost("h1")
    here = Host.open(str(p.host.sim.root))
    monkeypatch.setenv("GPUSLATE_STATE_DIR", str(p.host.state_dir))
    monkeypatch.delenv("GPUSLATE_CONFIG", raising=False)
    up = remote.up("a", UpOptions())
    assert isinstance(up, UpResult) and up.status is UpStatus.READY and up.record.gpus == [0], up.to_json()
    mine = here.up("b")  # the same resolution here
    assert mine.status is UpStatus.READY and mine.record.gpus == [1], mine.to_json()
    opts = LogsOptions(tail=5, since=1.0, timestamps=True)
    there_logs, here_logs = remote.logs("a", opts), here.logs("a", opts)
    assert isinstance(there_logs, LogsResult) and there_logs.to_json() == here_logs.to_json()
    assert there_logs.lines and there_logs.times and None not in there_logs.times
    with pytest.raises(UsageError, match="unknown unit 'nope'"):
        here.logs("nope")
    for limit in (1, 0):  # the newest; all (the two signals of 'down a b' at least)
        there_audit, here_audit = remote.audit(AuditOptions(limit=limit)), here.audit(AuditOptions(limit=limit))
        assert isinstance(there_audit, AuditListing) and there_audit.to_json() == here_audit.to_json()
        assert there_audit.to_json()["schema"] == "gpuslate.audit.v1"
        assert len(there_audit.entries) == 1 if limit else len(there_audit.entries) >= 2
    assert remote.audit(AuditOptions(limit=1, old_name=True)).to_json()["schema"] == "gpuslate.log.v1"
    with pytest.raises(UsageError, match="by name"):  # refused here: nothing ran there
        remote.swap("a", UnitSpec("c", command=["serve"], port=1))
    with pytest.raises(UsageError, match="at least 0"):
        remote.audit(AuditOptions(limit=-1))
    with pytest.raises(UsageError, match="since 1970"):
        remote.logs("a", LogsOptions(since=-1.0))
    assert p.local("down", "a", "b").returncode == 0
