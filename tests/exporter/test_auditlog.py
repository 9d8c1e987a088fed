"""The audit-log tail: incremental, bounded, monotonic counts, from a real audit log file."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from gpuslate.errors import PermissionDenied
from gpuslate.exporter import auditlog
from gpuslate.exporter.auditlog import AuditTail
from gpuslate.host.audit import AuditLog, of_host


def target(pid: int, unit: str | None = None) -> dict:
    t = {"pid": pid, "start_ticks": 1, "command": "python serve.py"}
    return {**t, "unit": unit} if unit else t


def signal_phase(log: AuditLog, run: str, action: str, sig: str, targets: list[dict],
                 outcome: str | None = "delivered") -> None:
    ids = log.before_signals(run_id=run, action=action, signal=sig, targets=targets)
    if outcome is not None:
        log.outcomes([(i, outcome, None) for i in ids])


@pytest.fixture
def log(tmp_path: Path) -> AuditLog:
    return AuditLog(tmp_path / "audit.jsonl", backend="sim", sim_root=str(tmp_path / "sim"))


def tail_of(log: AuditLog) -> AuditTail:
    return AuditTail(log.path, of_host(log.sim_root))


def test_counts_runs_signals_outcomes_and_unit_stops(log):
    tail = tail_of(log)
    tail.update()  # no log yet: nothing, no error
    assert tail.counts.signals == {} and not tail.counts.clear_runs
    signal_phase(log, "r1", "clear", "SIGTERM", [target(1), target(2)])
    signal_phase(log, "r1", "clear", "SIGKILL", [target(2)], outcome="not_running")
    signal_phase(log, "r2", "down", "SIGTERM", [target(3, "web"), target(4, "web")])
    signal_phase(log, "r3", "clear", "SIGTERM", [target(5)], outcome=None)  # interrupted: no outcome
    tail.update()
    c = tail.counts
    assert len(c.clear_runs) == 2
    assert c.signals == {("clear", "SIGTERM"): 3, ("clear", "SIGKILL"): 1, ("down", "SIGTERM"): 2}
    assert c.outcomes == {("clear", "SIGTERM", "delivered"): 2, ("clear", "SIGKILL", "not_running"): 1,
                          ("down", "SIGTERM", "delivered"): 2}
    assert {k: len(v) for k, v in c.unit_stops.items()} == {("web", "down"): 1}
    signal_phase(log, "r4", "down", "SIGTERM", [target(6, "web")])
    tail.update()
    assert {k: len(v) for k, v in c.unit_stops.items()} == {("web", "down"): 2}


def test_only_what_was_appended_is_read(log):
    signal_phase(log, "r1", "clear", "SIGTERM", [target(1), target(2), target(3)])
    tail = tail_of(log)
    tail.update()
    size = log.path.stat().st_size
    assert tail._offset == size and size > 2 * auditlog.HEAD
    # blank the counted bytes after the file's first ones, in place: a tail that re-parsed them
    # would lose those entries
    with open(log.path, "r+b") as f:
        f.seek(auditlog.HEAD)
        f.write(b" " * (size - auditlog.HEAD - 1))
    signal_phase(log, "r2", "clear", "SIGTERM", [target(4)])
    tail.update()
    assert tail.counts.signals == {("clear", "SIGTERM"): 4} and len(tail.counts.clear_runs) == 2


def test_a_line_being_written_waits_and_a_torn_one_is_skipped(log):
    signal_phase(log, "r1", "clear", "SIGTERM", [target(1)])
    with open(log.path, "ab") as f:
        f.write(b'{"event":"signal","id":"half"')  # a writer still at it (or one that crashed)
    tail = tail_of(log)
    tail.update()
    assert tail.counts.signals == {("clear", "SIGTERM"): 1}
    signal_phase(log, "r2", "clear", "SIGTERM", [target(2)])  # the next writer starts on a new line
    tail.update()
    assert tail.counts.signals == {("clear", "SIGTERM"): 2} and tail.counts.outcomes[
        ("clear", "SIGTERM", "delivered")] == 2


def test_other_hosts_entries_are_not_counted(log, tmp_path):
    other = AuditLog(log.path, backend="sim", sim_root=str(tmp_path / "other-sim"))
    nvml = AuditLog(log.path, backend="nvml")
    signal_phase(other, "r1", "clear", "SIGTERM", [target(1)])
    signal_phase(nvml, "r2", "clear", "SIGTERM", [target(2)])
    signal_phase(log, "r3", "clear", "SIGKILL", [target(3)])
    tail = tail_of(log)
    tail.update()
    assert tail.counts.signals == {("clear", "SIGKILL"): 1}
    assert tail.counts.outcomes == {("clear", "SIGKILL", "delivered"): 1}


def test_a_replaced_or_truncated_log_is_counted_from_its_start(log):
    signal_phase(log, "r1", "clear", "SIGTERM", [target(1), target(2)])
    tail = tail_of(log)
    tail.update()
    os.truncate(log.path, 0)
    signal_phase(log, "r2", "clear", "SIGTERM", [target(3)])
    tail.update()
    assert tail.counts.signals == {("clear", "SIGTERM"): 1}  # a counter reset, as Prometheus expects
    log.path.unlink()
    signal_phase(log, "r3", "clear", "SIGKILL", [target(4)])
    tail.update()
    assert tail.counts.signals == {("clear", "SIGKILL"): 1}


def test_one_update_reads_a_bounded_amount(log, monkeypatch):
    for i in range(40):
        signal_phase(log, f"r{i}", "clear", "SIGTERM", [target(i)])
    monkeypatch.setattr(auditlog, "MAX_READ", 2048)
    tail = tail_of(log)
    tail.update()
    first = sum(tail.counts.signals.values())
    assert 0 < first < 40
    while tail._offset < log.path.stat().st_size:
        tail.update()
    assert tail.counts.signals == {("clear", "SIGTERM"): 40} and len(tail.counts.clear_runs) == 40


def test_symlink_and_fifo_are_refused_without_hanging(tmp_path):
    real = tmp_path / "real.jsonl"
    real.write_text("")
    link = tmp_path / "audit.jsonl"
    link.symlink_to(real)
    with pytest.raises(PermissionDenied, match="symbolic link"):
        AuditTail(link, lambda e: True).update()
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    done = threading.Event()

    def attempt() -> None:
        with pytest.raises(PermissionDenied, match="not a regular file"):
            AuditTail(fifo, lambda e: True).update()
        done.set()

    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    t.join(10)
    assert done.is_set(), "reading a FIFO as the audit log blocked"
