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
    mps: dict[int, int] = {}
    for i in range(data.draw(st.integers(0, 3))):
        pid, server = 910 + i, data.draw(st.sampled_from(sorted(servers)))
        f.procs[pid] = ProcStat(pid, "python", data.draw(st.sampled_from("SSZ")), 1, pid, pid, pid, 0)
        f.argvs[pid], f.uids[pid], f.exes[pid] = ("python", "serve.py"), ME, "/usr/bin/python3.11"
        holds.append(Hold(pid, data.draw(st.sampled_from(sorted(servers[server]))), "mps", 1 << 30))
        mps[pid] = server
    for h in w.holds:  # some holders of the world are clients too
        if h.pid in f.procs and h.pid not in mps and data.draw(st.integers(0, 3)) == 0:
            mps[h.pid] = data.draw(st.sampled_from(sorted(servers)))
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
    for client, server in mps.items():
        st_ = f.procs.get(client)
        if server in targets and st_ is not None and not st_.has_exited:
            assert client in targets, (client, server, with_mps)
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
    facts = Facts(f, holds, 2, 99, ME, {20: 10, 30: 10})
    d = decide(facts, Resolved(Selection(gpus=(0,), include_handles=True), None, None))
    assert [t.pid for t in d.targets] == [20]
    (server,) = [s for s in d.spared if s.pid == 10]
    assert server.reason.startswith(f"{MPS_SHARED} (PID 30)")
    d = decide(facts, Resolved(Selection(include_handles=True), None, None))
    assert [t.pid for t in d.targets] == [10, 20, 30]
    d = decide(facts, Resolved(Selection(gpus=(0,)), None, None))  # without --include-handles: a daemon
    assert [t.pid for t in d.targets] == [20] and "GPU daemon" in next(s for s in d.spared if s.pid == 10).reason
