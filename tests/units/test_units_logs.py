"""``logs --timestamps`` and ``logs --since`` (docker's meanings), from the line times the log relay
records as the unit writes: a real unit printing lines on cue, the relay outside the unit (its
own session, not a member, never signaled by ``down``) and gone once the unit is."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from gpuslate._time import iso_time_us, parse_iso_time, parse_since
from gpuslate.proc.procfs import read_stat
from gpuslate.units.logfile import KEEP, LogsResult, open_for_unit
from helpers import is_gone, wait_for

#: prints "first", then "second" once the file named by argv[1] exists, then waits to be stopped
TALKER = r"""
import os, sys, time
print("first", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.005)
print("second", flush=True)
print("no newline at the end", end="", flush=True)
while True:
    time.sleep(60)
"""


def relays_of(log: Path) -> list[int]:
    """The log relays writing ``log`` (their stdout is it)."""
    found = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            if os.readlink(f"/proc/{pid}/fd/1") == str(log):
                found.append(pid)
        except OSError:
            continue
    return found


@pytest.fixture
def talker(units_host, units, tmp_path):
    cue = tmp_path / "cue"
    r = units("up", "talk", "--ready-log", "^first$", "--json", "--", sys.executable, "-c", TALKER, str(cue))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    yield doc, cue
    units("down", "talk")


def test_lines_carry_the_time_they_were_written(talker, units):
    doc, cue = talker
    log = Path(doc["log"])
    between = time.time()
    cue.write_text("")
    wait_for(lambda: "second" in log.read_text())
    after = time.time()
    r = units("logs", "talk", "--timestamps")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [ln.split(" ", 1)[1] for ln in lines] == ["first", "second", "no newline at the end"]
    stamps = [parse_iso_time(ln.split(" ", 1)[0]) for ln in lines]
    assert stamps[0] < between <= stamps[1] <= stamps[2] <= after + 0.001, (stamps, between, after)
    assert all(ln[:27].endswith("Z") and len(ln.split(" ", 1)[0]) == 27 for ln in lines)  # RFC 3339, µs, UTC
    # --since: docker's meanings, a time (RFC 3339) or a duration back from now
    r = units("logs", "talk", "--since", iso_time_us(between))
    assert r.returncode == 0 and r.stdout == "second\nno newline at the end\n", r.stdout
    r = units("logs", "talk", "--since", "1h", "-n", "1")
    assert r.stdout == "no newline at the end\n"
    r = units("logs", "talk", "--since", "1m", "--json", "-t")
    got = LogsResult.from_json(json.loads(r.stdout))
    assert got.lines == ["first", "second", "no newline at the end"] and got.times is not None
    assert [round(t, 6) for t in got.times] == [round(s, 6) for s in stamps]  # type: ignore[arg-type]
    assert LogsResult.from_json(got.to_json()).to_json() == got.to_json()
    r = units("logs", "talk", "--since", "2099-01-01T00:00:00Z")  # nothing written since then
    assert r.returncode == 0 and r.stdout == ""


def test_the_relay_is_outside_the_unit_and_goes_with_it(talker, units):
    doc, _ = talker
    log = Path(doc["log"])
    relays = relays_of(log)
    assert len(relays) == 1, relays
    relay = read_stat(relays[0])
    assert relay is not None and relay.name == "gpuslate-logs" and relay.sid == relay.pid != doc["sid"]
    ps = json.loads(units("ps", "--json").stdout)
    assert relays[0] not in next(u for u in ps["units"] if u["name"] == "talk")["processes"]
    r = units("down", "talk", "--json")
    assert r.returncode == 0, r.stderr
    stopped = json.loads(r.stdout)
    assert relays[0] not in {p["pid"] for p in stopped["processes"] + stopped["swept"]}  # never signaled
    wait_for(lambda: is_gone(relays[0]))  # its pipe's last writer is gone: it leaves


def test_a_log_without_line_times_refuses_since_and_shows_lines_without(talker, units):
    doc, _ = talker
    Path(doc["log"] + ".times").unlink()
    r = units("logs", "talk", "--since", "10m")
    assert r.returncode == 2 and "has no line times" in r.stderr and "Traceback" not in r.stderr
    r = units("logs", "talk", "-t")
    assert r.returncode == 0 and r.stdout == "-" + " " * 26 + " first\n", r.stdout


@pytest.mark.parametrize("bad", ["10x", "yesterday", "2023-13-01", "1" * 80, ""])
def test_a_bad_since_is_one_line_and_exit_2(units_host, units, bad):
    r = units("logs", "talk", "--since", bad)
    assert r.returncode == 2 and "argument --since" in r.stderr and "Traceback" not in r.stderr


def test_since_reads_durations_and_times_as_docker_does():
    now = 1_700_000_000.0
    assert parse_since("10m", now) == now - 600 and parse_since("1h30m", now) == now - 5400
    assert parse_since("1.5h", now) == now - 5400 and parse_since("42s", now) == now - 42
    assert parse_since("2023-11-14T22:13:20Z", now) == now
    assert parse_since("2023-11-14T23:13:20+01:00", now) == now
    assert parse_since("2023-11-14T22:13:20.25Z", now) == now + 0.25
    assert parse_since("1700000000.5", now) == now + 0.5  # Unix seconds
    os.environ["TZ"], tz = "UTC", os.environ.get("TZ")
    try:
        time.tzset()
        assert parse_since("2023-11-14 22:13:20", now) == now  # no zone: local time
        assert parse_since("2023-11-14", now) == now - (22 * 3600 + 13 * 60 + 20)
    finally:
        if tz is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = tz
        time.tzset()


def test_rotation_keeps_each_runs_times_with_its_log(tmp_path):
    log = tmp_path / "logs" / "rot.log"
    for run in range(7):
        fds = open_for_unit(log)
        os.write(fds[0], f"run {run}\n".encode())
        os.write(fds[1], str(run).encode())
        for fd in fds:
            os.close(fd)
    assert sorted(p.name for p in log.parent.iterdir()) == sorted(
        [f"rot.log{s}{t}" for s in ("", *(f".{i}" for i in range(1, KEEP + 1))) for t in ("", ".times")])
    assert (log.parent / "rot.log.2").read_text() == "run 4\n" and (log.parent / "rot.log.2.times").read_text() == "4"
