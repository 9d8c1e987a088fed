"""The exporter's rows as a pure function of facts: leaked and orphaned memory, labels."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslate.exporter.model import LABEL_LIMIT, Facts, account, is_orphaned, label
from gpuslate.gpu.types import GpuReading, MemoryInfo
from gpuslate.host.snapshot import GpuState, HolderProcess, Snapshot

GiB = 1024**3


def proc(pid: int, used: int | None, *, kind: str = "compute", pgid: int | None = None, root: int | None = None,
         visible: bool = True, command: str | None = "python serve.py", user: str | None = "alice") -> HolderProcess:
    return HolderProcess(pid, kind, used, 100 + pid if visible else None, user if visible else None, 1000,
                         "python", command if visible else None, 1, pgid if pgid is not None else pid, pid,
                         root if root is not None else pid, "S", None, visible)


def gpu(index: int, used: int | None, procs: list[HolderProcess], error: str | None = None) -> GpuState:
    memory = MemoryInfo(96 * GiB, used, 0, 96 * GiB - used) if used is not None else None
    return GpuState(GpuReading(index=index, uuid=f"GPU-{index}", name="H200", minor=index, memory=memory,
                               utilization_pct=0, temperature_c=30, power_w=70.0, power_limit_w=700.0, pstate="P0",
                               processes=procs, error=error), procs)


def snap(*gpus: GpuState) -> Snapshot:
    return Snapshot("host", "sim", "1", 0.0, list(gpus), [], [])


def test_leaked_is_used_memory_no_listed_process_holds():
    s = snap(gpu(0, 10 * GiB, [proc(10, 4 * GiB), proc(11, None, kind="handle")]),
             gpu(1, 2 * GiB, [proc(12, 3 * GiB)]),  # over-reported processes never make it negative
             gpu(2, None, [], error="GPU is lost"))
    rows = account(Facts(s, {}, {}, {})).gpus
    assert [(r.leaked, r.attributed, r.memory_holders, r.handle_holders) for r in rows] == [
        (6 * GiB, 4 * GiB, 1, 1), (0, 3 * GiB, 1, 0), (None, 0, 0, 0)]


def test_orphaned_needs_a_leader_known_dead():
    workers = [proc(21, GiB, pgid=20), proc(22, GiB, pgid=30), proc(23, GiB, pgid=40),
               proc(24, GiB, pgid=24),  # leads its own group
               proc(25, None, pgid=20),  # memory not reported: counted, not in the bytes
               proc(26, None, kind="handle", pgid=20),  # a handle holds no memory
               proc(27, GiB, pgid=20, visible=False)]  # not visible: no facts about it
    s = snap(gpu(0, 6 * GiB, workers))
    acc = account(Facts(s, {20: False, 30: True}, {}, {}))  # 40: unknown
    (row,) = acc.gpus
    assert row.orphaned == GiB and row.orphaned_processes == 2
    assert {p.pid: p.orphaned for p in acc.processes} == {21: True, 22: False, 23: False, 24: False, 27: False}


def test_process_rows_carry_job_unit_and_safe_labels():
    worker = proc(31, 5 * GiB, pgid=30, root=30, command="sglang::scheduler\x1b[2J\nTP0", user="bob\x07")
    s = snap(gpu(3, 5 * GiB, [worker]))
    (row,) = account(Facts(s, {30: True}, {30: 'bash -c "run.sh"'}, {31: "web"})).processes
    assert row == row._replace(gpu=3, slot=0, pid=31, kind="compute", user="bob\\x07",
                               command="sglang::scheduler\\x1b[2J TP0", job_pid=30, job_command='bash -c "run.sh"',
                               unit="web", orphaned=False, bytes=5 * GiB)
    (unknown,) = account(Facts(s, {}, {}, {})).processes
    assert unknown.job_command == "" and unknown.unit == ""


@given(st.text(max_size=LABEL_LIMIT * 3))
def test_a_label_is_one_bounded_printable_line(text):
    out = label(text)
    assert len(out) <= LABEL_LIMIT and out.isprintable() and "\n" not in out
    assert label(None) == ""


holder = st.builds(
    lambda pid, used, kind, leader, visible: proc(pid, used, kind=kind, pgid=leader, visible=visible),
    st.integers(2, 60), st.one_of(st.none(), st.integers(0, 8 * GiB)),
    st.sampled_from(["compute", "graphics", "mps", "handle"]), st.integers(2, 60), st.booleans())


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.none(), st.integers(0, 96 * GiB)),
                          st.lists(holder, max_size=8, unique_by=lambda p: p.pid)), min_size=1, max_size=4),
       st.dictionaries(st.integers(2, 60), st.booleans()))
def test_accounting_invariants(gpus, leaders):
    s = snap(*(gpu(i, used, procs) for i, (used, procs) in enumerate(gpus)))
    acc = account(Facts(s, leaders, {}, {}))
    for row, (used, procs) in zip(acc.gpus, gpus):
        holders = [p for p in procs if p.kind != "handle"]
        assert row.memory_holders + row.handle_holders == len(procs)
        assert 0 <= row.orphaned <= row.attributed and row.orphaned_processes <= row.memory_holders
        if used is None:
            assert row.leaked is None
        else:
            assert row.leaked >= 0 and row.leaked + row.attributed >= used
        # unknown facts never raise the alarm: orphaned only with a leader known dead
        for p in holders:
            if is_orphaned(p, leaders):
                assert leaders[p.pgid] is False and p.visible and p.pgid != p.pid
        mine = [r for r in acc.processes if r.gpu == row.gpu]
        assert sum(r.bytes for r in mine) == row.attributed
        assert sum(r.bytes for r in mine if r.orphaned) == row.orphaned


def test_an_idle_mps_server_is_free_and_its_memory_a_baseline_apart():
    """The H200's measurement: an idle server holds 66 MiB, the GPU reads 74 MiB used; with a client
    the GPU is busy and the client's series names its server."""
    mib = 1024**2
    server = proc(40, 66 * mib)._replace(daemon="nvidia-cuda-mps-server")
    client = proc(41, 2 * GiB, kind="mps")._replace(mps_server=40)
    s = snap(gpu(0, 74 * mib, [server]), gpu(1, 2 * GiB + 74 * mib, [server, client]),
             gpu(2, 74 * mib, [proc(42, 66 * mib)]),  # the same memory held by no daemon
             gpu(3, None, [], error="GPU is lost"))
    acc = account(Facts(s, {}, {}, {}, max_used=64 * mib))
    assert [(g.free, g.daemon_memory) for g in acc.gpus] == [(True, 66 * mib), (False, 66 * mib), (False, 0),
                                                            (False, 0)]
    assert {(p.gpu, p.pid): (p.kind, p.mps_server) for p in acc.processes} == {
        (0, 40): ("compute", ""), (1, 40): ("compute", ""), (1, 41): ("mps", "40"), (2, 42): ("compute", "")}
    assert all(g.free is None for g in account(Facts(s, {}, {}, {})).gpus)  # the default not known: not said


def test_a_restarted_worker_keeps_its_series_key_and_only_its_info_changes():
    """The memory series is keyed by (gpu, unit, user, slot): what a restart keeps. The new pid and
    command are in the info series of that key."""
    def rows(pids):
        procs = [proc(p, GiB, pgid=pids[0], root=pids[0], command=f"worker {p}") for p in pids[1:]]
        s = snap(gpu(0, 2 * GiB, procs))
        return account(Facts(s, {}, {}, dict.fromkeys(pids, "web"))).processes

    before, after = rows([10, 11, 12]), rows([20, 21, 22])
    key = lambda r: (r.gpu, r.unit, r.user, r.slot)  # noqa: E731
    assert [key(r) for r in before] == [key(r) for r in after] == [(0, "web", "alice", 0), (0, "web", "alice", 1)]
    assert [r.pid for r in after] == [21, 22] and [r.command for r in after] == ["worker 21", "worker 22"]
    # two users' processes outside units number their slots apart
    s = snap(gpu(1, 3 * GiB, [proc(31, GiB, user="bob"), proc(32, GiB, user="alice"), proc(33, GiB, user="bob")]))
    assert [(r.user, r.slot, r.pid) for r in account(Facts(s, {}, {}, {})).processes] == [
        ("bob", 0, 31), ("alice", 0, 32), ("bob", 1, 33)]
