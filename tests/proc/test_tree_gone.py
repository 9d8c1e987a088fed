"""A process that exits between the reading of the process table and the reading of its other facts.

The act-time gate reads the table, then each process's namespace and signal facts. A process that
exits in between has no facts to read; it must not be counted as an unknown member of a namespace
(a spurious refusal under load: CI saw ``clear`` refuse a namespaced holder over a process of another
test that had just exited), while a process whose facts are unreadable but which still lives stays
unknown, and so a possible member (unknown facts never widen a job: here they narrow it).
"""

from __future__ import annotations

import os
import subprocess
import sys

from gpuslate.proc.collateral import namespace_members
from gpuslate.proc.procfs import ProcStat, SignalFacts, read_signal_facts
from gpuslate.proc.tree import ProcTable


def test_a_process_gone_since_the_table_was_read_has_no_facts_and_no_entry():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        table = ProcTable()
        table.load_all()
        assert table.get(child.pid) is not None
    finally:
        child.kill()
        child.wait(10)  # reaped: /proc has no such pid any more
    assert table.pid_ns(child.pid) is None
    assert table.signal_facts(child.pid) is None
    assert table.get(child.pid) is None


def test_a_living_process_keeps_its_table_entry():
    table = ProcTable()
    table.load_all()
    me = os.getpid()
    assert table.pid_ns(me) is not None and table.get(me) is not None


class _View:
    """Processes 1 (an init, nspid depth 2) and 2, 3 whose facts cannot be read; 3 is gone."""

    def __init__(self) -> None:
        self.stats = {pid: ProcStat(pid, "p", "S", 0, pid, pid, 100 + pid, 0) for pid in (1, 2, 3)}

    def get(self, pid: int) -> ProcStat | None:
        return None if pid == 3 else self.stats.get(pid)

    def all_pids(self) -> list[int]:
        return [1, 2, 3]

    def pid_ns(self, pid: int) -> tuple[int, ...] | None:
        return (7, 1) if pid == 1 else None

    def signal_facts(self, pid: int) -> SignalFacts | None:
        return SignalFacts(1, (50, 1), 0, 0) if pid == 1 else None


def test_unknown_facts_count_as_a_member_only_while_the_process_lives():
    view = _View()
    init_facts = view.signal_facts(1)
    assert namespace_members(view, 1, init_facts) == [2]  # type: ignore[arg-type]
    assert read_signal_facts(10**9) is None  # no such process: nothing to read
