"""Units as compose users expect them: ``up``/``down`` of several units or of every unit of the file,
``restart NAME`` (as it last ran), ``rm`` of a stopped unit, ``ps`` leaving out units stopped long
ago unless ``-a``. Real units (``sim hold`` on their own GPUs) on a simulated host."""

from __future__ import annotations

import json
import sys
import time

import pytest

from gpuslate.units.batch import BatchResult
from gpuslate.units.listing import PsOptions, hidden_by
from gpuslate.units.remove import RmResult
from gpuslate.units.restart import RestartResult
from gpuslate.units.state import UnitState
from helpers import is_gone, unit_records

HOLD = [sys.executable, "-m", "gpuslate", "sim", "hold", "--memory", "1GiB"]


def unit_file(path, *names: str, broken: str | None = None) -> None:
    text = ""
    for gpu, name in enumerate(names):
        cmd = [*HOLD, "--gpus", str(gpu)] if name != broken else [sys.executable, "-c", "raise SystemExit(3)"]
        text += (f'[units.{name}]\ncommand = {json.dumps(cmd)}\ngpus = "{gpu}"\nready_log = "ready"\n'
                 "start_timeout = 30\ngrace = 2\n\n")
    path.write_text(text)


def doc(r) -> dict:
    assert r.stdout, r.stderr
    return json.loads(r.stdout)


def running(units) -> dict[str, str]:
    return {u["name"]: u["state"] for u in doc(units("ps", "--json", "-a"))["units"]}


def test_up_and_down_of_every_unit_of_the_file(units_host, units, tmp_path):
    unit_file(tmp_path / "gpuslate.toml", "a", "b", "c")
    r = units("up", "--json", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    batch = BatchResult.from_json(doc(r))
    assert batch.to_json() == doc(r) and batch.ok and batch.verb.value == "up"
    assert [x.record.name for x in batch.results] == ["a", "b", "c"]  # the file's order
    assert running(units) == {"a": "ready", "b": "ready", "c": "ready"}
    again = units("up", cwd=str(tmp_path))  # as compose: what runs is left as it is
    assert again.returncode == 0, again.stderr
    assert "Unit a: already running, left as it is" in again.stdout and "up: 0 of 0 units done" in again.stdout
    r = units("down", "--json", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    down = BatchResult.from_json(doc(r))
    assert [x.name for x in down.results] == ["c", "b", "a"]  # the reverse order, as compose
    assert all(x.report.released for x in down.results)  # type: ignore[union-attr]
    assert running(units) == {"a": "stopped", "b": "stopped", "c": "stopped"}


def test_up_of_several_stops_at_the_first_failure_and_says_what_was_not_started(units_host, units, tmp_path):
    unit_file(tmp_path / "gpuslate.toml", "a", "b", "c", broken="b")
    r = units("up", "a", "b", "c", "--json", cwd=str(tmp_path))
    assert r.returncode == 7, r.stderr  # partial: a started, b failed
    batch = doc(r)
    assert batch["status"] == "failed" and [x["name"] for x in batch["results"]] == ["a", "b"]
    assert batch["results"][1]["status"] == "exited" and batch["not_run"] == ["c"]
    assert "Not started (unit b failed first): c" in r.stderr
    assert running(units) == {"a": "ready", "b": "failed"}
    r = units("up", "b", "c", cwd=str(tmp_path))
    assert r.returncode == 6, r.stderr  # the only unit that ran failed: its own code
    r = units("down", "a", "b", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "down: 2 of 2 units done" in r.stdout


def test_several_units_take_no_options_that_define_one_and_unknown_names_do_nothing(units_host, units, tmp_path):
    unit_file(tmp_path / "gpuslate.toml", "a", "b")
    for args, why in ((("up", "a", "b", "--port", "1", "--ready", "/x"), "--port, --ready define one unit"),
                      (("up", "--gpus", "0"), "--gpus defines one unit"),
                      (("up", "a", "b", "--", "sleep", "1"), "a command after '--' is one unit's")):
        r = units(*args, cwd=str(tmp_path))
        assert r.returncode == 2 and why in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
    r = units("down", "a", "nope", cwd=str(tmp_path))
    assert r.returncode == 2 and "unknown unit 'a'" in r.stderr  # a was never started: nothing is done
    r = units("up", cwd=str(tmp_path / ".."), env={"GPUSLATE_CONFIG": ""})
    assert r.returncode == 2 and "acts on every unit of the unit file" in r.stderr


def test_restart_runs_the_unit_as_it_last_ran(units_host, units, tmp_path):
    unit_file(tmp_path / "gpuslate.toml", "a")
    assert units("up", "a", cwd=str(tmp_path)).returncode == 0
    first = unit_records().load("a")
    # the file changes meanwhile: restart (as compose's) keeps what ran, up after down takes the file
    (tmp_path / "gpuslate.toml").write_text((tmp_path / "gpuslate.toml").read_text().replace("1GiB", "2GiB"))
    r = units("restart", "a", "--json", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    res = RestartResult.from_json(doc(r))
    assert res.to_json() == doc(r) and res.ok and res.previous_state is UnitState.READY
    assert res.down is not None and res.down.report.released and res.downtime_s is not None
    again = unit_records().load("a")
    assert again.pid != first.pid and again.instance != first.instance and is_gone(first.pid)
    assert again.spec["command"] == first.spec["command"] and "1GiB" in again.spec["command"]
    # stopped: restart just starts it
    assert units("down", "a").returncode == 0
    r = units("restart", "a")
    assert r.returncode == 0, r.stderr
    assert "restarted (stopped before)" in r.stdout and "downtime" not in r.stdout
    assert units("restart", "nope").returncode == 2
    assert units("down", "a").returncode == 0


def test_ps_leaves_out_units_stopped_long_ago_and_rm_removes_them(units_host, units, tmp_path):
    """ps without -a leaves out a unit stopped two hours ago; rm removes a stopped unit's record and
    logs, and refuses a running one (then removing nothing)."""
    unit_file(tmp_path / "gpuslate.toml", "a", "b")
    assert units("up", "a", "b", cwd=str(tmp_path)).returncode == 0
    assert units("down", "a").returncode == 0
    store = unit_records()
    rec = json.loads((store.units_dir() / "a.json").read_text())
    rec["stopped_at"] -= 2 * 3600  # stopped two hours ago
    (store.units_dir() / "a.json").write_text(json.dumps(rec))
    shown = doc(units("ps", "--json"))
    assert [u["name"] for u in shown["units"]] == ["b"] and shown["hidden"] == 1
    r = units("ps")
    assert "(1 unit stopped more than an hour ago not shown: gpuslate ps -a)" in r.stdout
    assert [u["name"] for u in doc(units("ps", "-a", "--json"))["units"]] == ["a", "b"]
    before = sorted(p.name for p in store.log_path("a").parent.iterdir())
    r = units("rm", "a", "b")  # b runs: nothing is removed
    assert r.returncode == 2 and "unit b is running (ready): nothing was removed" in r.stderr
    assert store.load("a") is not None
    r = units("rm", "a", "--json")
    assert r.returncode == 0, r.stderr
    removed = RmResult.from_json(doc(r))
    assert removed.to_json() == doc(r) and [u.name for u in removed.units] == ["a"]
    assert {p.rsplit("/", 1)[1] for p in removed.units[0].files} == {"a.json", "a.log", "a.log.times"}
    assert store.load("a") is None and "b" in running(units)
    assert sorted(p.name for p in store.log_path("a").parent.iterdir()) == [n for n in before if n.startswith("b.")]
    assert units("rm", "a").returncode == 2  # gone: unknown
    assert units("down", "b").returncode == 0 and units("rm", "b").returncode == 0
    assert running(units) == {}



@pytest.mark.parametrize(("state", "ago", "hidden"), [
    (UnitState.STOPPED, 7200, True), (UnitState.FAILED, 7200, True), (UnitState.STOPPED, 60, False),
    (UnitState.EXITED, 7200, False), (UnitState.READY, 7200, False), (UnitState.ORPHANED, 7200, False),
    (UnitState.CORRUPT, 7200, False)])
def test_the_ps_rule(state, ago, hidden):
    now = time.time()
    assert hidden_by(PsOptions(all=False), state, now - ago, now) is hidden
    assert not hidden_by(PsOptions(all=True), state, now - ago, now)
    assert not hidden_by(PsOptions(all=False), state, None, now)  # never stopped by gpuslate: shown
