"""The planner with MPS, as a model: the forests of test_plan_model.py with some holders made MPS
servers (their program nvidia-cuda-mps-server) and others their clients. Whatever the selection, a
targeted server has no live client outside the targets (ending it would end their GPU work), and the
MPS facts never add a target: the plan with them is the plan without them, less spared servers."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuslate.clearing.plan import MPS_SHARED, Facts, Hold, Resolved, Selection, attribute, decide
from gpuslate.errors import UsageError
from test_plan_model import ME, Forest, selections, worlds

SERVER_EXE = "/usr/bin/nvidia-cuda-mps-server"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_targeted_server_has_every_live_client_among_the_targets(data: st.DataObject) -> None:
    from gpuslate.proc.procfs import ProcStat

    w = data.draw(worlds())
    f = w.forest
    holds = list(w.holds)
    # MPS on top of the world: servers of the caller's, each in a group of its own (as the control
    # daemon starts them), holding memory on GPUs; clients new or already there, on a server's GPUs
    servers: dict[int, set[int]] = {}
    for i in range(data.draw(st.integers(1, 2))):
        pid = 900 + i
        f.procs[pid] = ProcStat(pid, "nvidia-cuda-mps", "S", 1, pid, pid, pid, 0)
        f.argvs[pid], f.uids[pid], f.exes[pid] = ("nvidia-cuda-mps-server",), ME, SERVER_EXE
        servers[pid] = set(data.draw(st.sets(st.integers(0, w.gpus - 1), min_size=1)))
        holds += [Hold(pid, g, "compute", 66 << 20) for g in servers[pid]]
    mps: dict[int, tuple[int, ...]] = {}

    def options() -> tuple[int, ...]:  # the servers a client could use: its own, or more (its pipe unknown)
        return tuple(sorted(data.draw(st.sets(st.sampled_from(sorted(servers)), min_size=1))))

    for i in range(data.draw(st.integers(0, 3))):
        pid, could = 910 + i, options()
        f.procs[pid] = ProcStat(pid, "python", data.draw(st.sampled_from("SSZ")), 1, pid, pid, pid, 0)
        f.argvs[pid], f.uids[pid], f.exes[pid] = ("python", "serve.py"), ME, "/usr/bin/python3.11"
        holds.append(Hold(pid, data.draw(st.sampled_from(sorted(servers[could[0]]))), "mps", 1 << 30))
        mps[pid] = could
    for h in w.holds:  # some holders of the world are clients too
        if h.pid in f.procs and h.pid not in mps and data.draw(st.integers(0, 3)) == 0:
            mps[h.pid] = options()
    w = w._replace(holds=tuple(holds))
    res = data.draw(selections(w))
    if data.draw(st.booleans()):
        res = res._replace(sel=res.sel._replace(include_handles=True))
    attributed = attribute(w.holds, lambda pid: pid in f.procs, w.threads.get)
    try:
        with_mps = decide(Facts(f, attributed, w.gpus, w.caller, ME, mps), res)
    except UsageError:
        return
    plain = decide(Facts(f, attributed, w.gpus, w.caller, ME), res)
    targets = {t.pid for t in with_mps.targets}
    for client, could in mps.items():
        st_ = f.procs.get(client)
        if set(could) & targets and st_ is not None and not st_.has_exited:
            assert client in targets, (client, could, with_mps)
    # MPS facts only ever spare: every target with them is one without them
    assert targets <= {t.pid for t in plain.targets}
    for s in with_mps.spared:
        if s.reason.startswith(MPS_SHARED):
            assert s.pid in servers and s.pid in {t.pid for t in plain.targets}
    assert decide(Facts(f, attributed, w.gpus, w.caller, ME, mps), res) == with_mps  # same facts, same plan


def test_a_server_with_a_client_elsewhere_is_spared_and_then_ended_with_it() -> None:
    from gpuslate.proc.procfs import ProcStat

    procs = {1: ProcStat(1, "systemd", "S", 0, 1, 1, 1, 0),
             10: ProcStat(10, "nvidia-cuda-mps", "S", 1, 10, 10, 10, 0),  # the server, in a group of its own
             20: ProcStat(20, "python", "S", 1, 20, 20, 20, 0),  # a client on GPU 0
             30: ProcStat(30, "python", "S", 1, 30, 30, 30, 0)}  # a client on GPU 1
    f = Forest(procs, {}, dict.fromkeys(procs, ME), {1: "/usr/lib/systemd/systemd", 10: SERVER_EXE,
                                                     20: "/usr/bin/python3.11", 30: "/usr/bin/python3.11"})
    holds = (Hold(10, 0, "compute", 66 << 20), Hold(10, 1, "compute", 66 << 20), Hold(20, 0, "mps", 1 << 30),
             Hold(30, 1, "mps", 1 << 30))
    facts = Facts(f, holds, 2, 99, ME, {20: (10,), 30: (10,)})
    d = decide(facts, Resolved(Selection(gpus=(0,), include_handles=True), None, None))
    assert [t.pid for t in d.targets] == [20]
    (server,) = [s for s in d.spared if s.pid == 10]
    assert server.reason.startswith(f"{MPS_SHARED} (PID 30)")
    d = decide(facts, Resolved(Selection(include_handles=True), None, None))
    assert [t.pid for t in d.targets] == [10, 20, 30]
    d = decide(facts, Resolved(Selection(gpus=(0,)), None, None))  # without --include-handles: a daemon
    assert [t.pid for t in d.targets] == [20] and "GPU daemon" in next(s for s in d.spared if s.pid == 10).reason


def test_a_client_whose_pipe_is_unknown_protects_every_server_it_could_use() -> None:
    """Issue 32: two servers; a client of one renamed itself, so its pipe folder is unknown. It could
    be either's client: neither server is a target while it is not one."""
    from gpuslate.proc.procfs import ProcStat

    procs = {1: ProcStat(1, "systemd", "S", 0, 1, 1, 1, 0),
             10: ProcStat(10, "nvidia-cuda-mps", "S", 1, 10, 10, 10, 0),
             11: ProcStat(11, "nvidia-cuda-mps", "S", 1, 11, 11, 11, 0),
             30: ProcStat(30, "sglang::schedul", "S", 1, 30, 30, 30, 0)}  # on GPU 1, not selected
    f = Forest(procs, {}, dict.fromkeys(procs, ME), {1: "/usr/lib/systemd/systemd", 10: SERVER_EXE,
                                                     11: SERVER_EXE, 30: "/usr/bin/python3.11"})
    holds = tuple(Hold(s, g, "compute", 66 << 20) for s in (10, 11) for g in (0, 1)) + (Hold(30, 1, "mps", 1 << 30),)
    sel = Resolved(Selection(gpus=(0,), include_handles=True), None, None)
    d = decide(Facts(f, holds, 2, 99, ME, {30: (10, 11)}), sel)
    assert [t.pid for t in d.targets] == []
    assert all(s.reason.startswith(f"{MPS_SHARED} (PID 30)") for s in d.spared if s.pid in (10, 11))
    d = decide(Facts(f, holds, 2, 99, ME, {30: (10,)}), sel)  # its pipe read: only its own server is held
    assert [t.pid for t in d.targets] == [11]


@given(st.dictionaries(st.integers(1, 6), st.tuples(st.sampled_from([None, 1000, 1001]),
                                                     st.frozensets(st.integers(0, 3), max_size=3)), max_size=4),
       st.dictionaries(st.integers(10, 14), st.tuples(st.sampled_from([None, 1000, 1001]),
                                                      st.frozensets(st.integers(0, 3), min_size=1, max_size=3)),
                       min_size=1, max_size=3),
       st.dictionaries(st.integers(1, 14), st.sampled_from([None, "/a", "/b"])), st.data())
def test_unknown_never_narrows_the_servers_a_client_could_use(clients, servers, pipes, data) -> None:
    """mps_possible: a server is left out only for a known fact (another uid, no GPU in common, two
    known pipe folders that differ); forgetting any fact (a uid, a pipe) only adds servers."""
    from gpuslate.host.daemons import MpsEnd, mps_possible

    cs = {p: MpsEnd(*v) for p, v in clients.items()}
    ss = {p: MpsEnd(*v) for p, v in servers.items()}
    got = mps_possible(cs, ss, pipes)
    for c, end in cs.items():
        for s, e in ss.items():
            ruled_out = ((end.uid is not None and e.uid is not None and end.uid != e.uid)
                         or (bool(end.gpus) and not end.gpus & e.gpus)
                         or (pipes.get(c) is not None and pipes.get(s) is not None and pipes[c] != pipes[s]))
            assert (s in got.get(c, ())) is not ruled_out
    forget = data.draw(st.sampled_from(sorted({*cs, *ss})))
    wider = mps_possible({p: (e._replace(uid=None) if p == forget else e) for p, e in cs.items()},
                         {p: (e._replace(uid=None) if p == forget else e) for p, e in ss.items()},
                         {**pipes, forget: None})
    for c, could in got.items():
        assert set(could) <= set(wider.get(c, ()))


def test_a_client_this_proc_does_not_show_protects_the_servers_on_its_gpus() -> None:
    """Found attacking issue 32: the driver lists an MPS client whose pid this /proc does not show (a
    container's). Its user and pipe folder are unknown, it is alive for the driver: it could be the client
    of every server on its GPUs, which are then no targets."""
    from gpuslate.proc.procfs import ProcStat

    procs = {1: ProcStat(1, "systemd", "S", 0, 1, 1, 1, 0), 10: ProcStat(10, "nvidia-cuda-mps", "S", 1, 10, 10, 10, 0)}
    f = Forest(procs, {}, dict.fromkeys(procs, ME), {1: "/usr/lib/systemd/systemd", 10: SERVER_EXE})
    holds = (Hold(10, 0, "compute", 66 << 20),)
    sel = Resolved(Selection(include_handles=True), None, None)
    assert [t.pid for t in decide(Facts(f, holds, 1, 99, ME, {}), sel).targets] == [10]
    d = decide(Facts(f, holds, 1, 99, ME, {4242: (10,)}), sel)  # 4242: listed by the driver, not in /proc
    assert d.targets == () and next(s for s in d.spared if s.pid == 10).reason.startswith(f"{MPS_SHARED} (PID 4242)")


def test_the_snapshot_counts_a_client_it_cannot_see_as_every_servers() -> None:
    from gpuslate.gpu.types import GpuReading, MemoryInfo
    from gpuslate.host.snapshot import GpuState, HolderProcess, mps_links

    def proc(pid: int, kind: str, visible: bool, daemon: str | None = None) -> HolderProcess:
        return HolderProcess(pid, kind, 1 << 20, 1 if visible else None, None, 1000 if visible else None, None, None,
                             None, None, None, pid, None, None, visible, daemon=daemon)

    reading = GpuReading(index=0, memory=MemoryInfo(1, 1, 0, 0), processes=[])
    states = [GpuState(reading, [proc(10, "compute", True, "nvidia-cuda-mps-server"),
                                 proc(11, "compute", True, "nvidia-cuda-mps-server"), proc(4242, "mps", False)])]
    named, possible = mps_links(states)
    assert named == {} and possible == {4242: (10, 11)}
