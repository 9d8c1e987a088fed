"""A daemon's baseline and an MPS client's server, as pure functions: what widens "free" is only
spared, proven daemons' reported memory, all of them together within the cap per GPU; a server is
named only when one qualifies; and a daemon is proven only when every fact of the proof is shown."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslate.clearing.wait import is_free
from gpuslate.gpu.types import GpuProcess, GpuReading, MemoryInfo
from gpuslate.host.daemons import BASELINE_CAP, DaemonHold, MpsEnd, baseline, mps_candidates, mps_servers, sharing
from gpuslate.proc.daemons import MPS_CONTROL, DaemonFacts, Env, why_unproven

MiB = 1024**2
SERVER = "nvidia-cuda-mps-server"


def reading(used: int, procs: list[GpuProcess], error: str | None = None) -> GpuReading:
    total = 140 * 1024 * MiB
    return GpuReading(index=0, minor=0, memory=MemoryInfo(total, used, 0, total - used), processes=procs,
                      error=error)


def test_an_idle_mps_server_as_measured_on_the_h200_is_free():
    """The H200 (driver 580): the server holds 66 MiB, the GPU reads 74 MiB used."""
    r = reading(74 * MiB, [GpuProcess(42, "compute", 66 * MiB)])
    assert not is_free(r, 64 * MiB)  # without knowing it is a daemon: a holder
    assert is_free(r, 64 * MiB, {42: SERVER})
    assert baseline(0, [(42, 66 * MiB)], {42: SERVER}) == [DaemonHold(0, 42, SERVER, 66 * MiB)]
    assert DaemonHold(0, 42, SERVER, 66 * MiB).describe() == f"66.0 MiB held by {SERVER} (PID 42) on GPU 0, spared"


def test_what_never_widens_free():
    daemons = {42: SERVER}
    # a client of the server: a holder whatever the server is
    assert not is_free(reading(2000 * MiB, [GpuProcess(42, "compute", 66 * MiB),
                                            GpuProcess(7, "mps", 1900 * MiB)]), 64 * MiB, daemons)
    # memory the driver does not report: the baseline is unknown
    assert not is_free(reading(74 * MiB, [GpuProcess(42, "compute", None)]), 64 * MiB, daemons)
    # more than daemons may hold on a GPU
    assert not is_free(reading(BASELINE_CAP + MiB, [GpuProcess(42, "compute", BASELINE_CAP + MiB)]), 64 * MiB, daemons)
    # issue 32: four daemons of 200 MiB each were each within the old 1 GiB per daemon; together they are not
    four = [GpuProcess(p, "compute", 200 * MiB) for p in (42, 43, 44, 45)]
    assert not is_free(reading(800 * MiB, four), 64 * MiB, dict.fromkeys((42, 43, 44, 45), SERVER))
    assert [h.pid for h in baseline(0, [(p.pid, p.used_memory) for p in four],
                                    dict.fromkeys((42, 43, 44, 45), SERVER))] == [42]
    # a failed query
    assert not is_free(reading(0, [GpuProcess(42, "compute", 66 * MiB)], error="x"), 64 * MiB, daemons)
    # memory beyond the daemon's own figure still counts
    assert not is_free(reading(200 * MiB, [GpuProcess(42, "compute", 66 * MiB)]), 64 * MiB, daemons)


_procs = st.lists(st.builds(GpuProcess, st.integers(1, 12), st.sampled_from(["compute", "mps", "graphics"]),
                            st.none() | st.integers(0, BASELINE_CAP // 2) | st.integers(0, 2 * BASELINE_CAP)),
                  max_size=6)


@settings(max_examples=400, deadline=None)
@given(_procs, st.integers(0, 4 * BASELINE_CAP), st.dictionaries(st.integers(1, 12), st.just(SERVER), max_size=6),
       st.integers(0, BASELINE_CAP))
def test_a_daemons_allowance_never_exceeds_the_cap_per_gpu(procs, used, daemons, max_used):
    """Issue 32: the allowance was per daemon (four daemons hid 4 GiB). Whatever the daemons and their
    memory, what they are allowed together on a GPU is at most the cap, and only theirs, reported."""
    r = reading(used, procs)
    pairs = [(p.pid, p.used_memory) for p in procs]
    base = baseline(0, pairs, daemons)
    assert sum(h.bytes for h in base) <= BASELINE_CAP
    assert len({h.pid for h in base}) == len(base) and [h.pid for h in base] == sorted(h.pid for h in base)
    for h in base:  # a daemon's whole reported memory on the GPU, never a part, never an unreported one
        mine = [u for pid, u in pairs if pid == h.pid]
        assert h.pid in daemons and None not in mine and h.bytes == sum(mine)  # type: ignore[arg-type]
    if is_free(r, max_used):
        assert is_free(r, max_used, daemons)  # knowing daemons never narrows free
    if is_free(r, max_used, daemons):
        held = {h.pid for h in base}
        assert all(p.pid in held for p in procs)  # every listed process is a daemon of the allowance
        assert used - sum(h.bytes for h in base) <= max_used
        assert used <= max_used + BASELINE_CAP  # however many daemons: the cap, once per GPU
    # with a smaller cap, never more daemons (the allowance only shrinks)
    assert {h.pid for h in baseline(0, pairs, daemons, cap=BASELINE_CAP // 2)} <= {h.pid for h in base}


_facts = st.builds(DaemonFacts, st.sampled_from([SERVER, MPS_CONTROL, "nvidia-persistenced"]),
                   st.sampled_from([None, True, False]), st.sampled_from([None, True, False]),
                   st.sampled_from([None, (0, 0, 0, 0), (1000, 1000, 1000, 1000), (1000, 0, 0, 0)]),
                   st.sampled_from([None, frozenset(), frozenset({1000})]), st.sampled_from(list(Env)),
                   st.sampled_from([None, "", "/home/u/libx.so"]), st.sampled_from([None, 0, 77]),
                   st.sampled_from([None, True, False]))


@given(_facts)
def test_a_daemon_is_proven_only_when_every_fact_is_shown(f):
    """why_unproven: proven (None) exactly when the program file is a system one and unchanged, the
    user root or documented, the environment read clean, no foreign code mapped, no debugger, and (an
    MPS server) its parent the control daemon. Any unknown is a reason."""
    proven = why_unproven(f) is None
    expected = (f.system_file is True and f.unchanged is True and f.uids is not None
                and (f.allowed is None or all(u == 0 or u in f.allowed for u in f.uids))
                and f.env == Env.CLEAN and f.foreign == "" and f.tracer == 0 and f.parent_control is True)
    assert proven == expected


def test_a_client_is_named_with_the_one_server_of_its_user_on_its_gpus():
    servers = {10: MpsEnd(1000, frozenset({0, 1})), 20: MpsEnd(2000, frozenset({0}))}
    clients = {1: MpsEnd(1000, frozenset({0})), 2: MpsEnd(2000, frozenset({0})), 3: MpsEnd(1000, frozenset({2})),
               4: MpsEnd(None, frozenset({0})), 5: MpsEnd(2000, frozenset({0, 1}))}
    candidates = mps_candidates(clients, servers)
    assert candidates == {1: [10], 2: [20]}  # 3: no server on GPU 2; 4: uid unknown; 5: its server is not on GPU 1
    found = mps_servers(candidates, {})  # one candidate each: no environment is needed
    assert found == {1: 10, 2: 20} and sharing(found) == {10: [1], 20: [2]}


def test_two_servers_of_one_user_are_told_apart_by_their_pipe_folders_or_not_at_all():
    servers = {10: MpsEnd(0, frozenset({0})), 11: MpsEnd(0, frozenset({0}))}
    pipes = {10: "/tmp/nvidia-mps", 11: "/run/mps-b", 1: "/run/mps-b", 2: None, 3: "/elsewhere"}
    clients = {c: MpsEnd(0, frozenset({0})) for c in (1, 2, 3)}
    assert mps_servers(mps_candidates(clients, servers), pipes) == {1: 11}
    three = mps_candidates(clients, {**servers, 12: MpsEnd(0, frozenset({0}))})
    assert mps_servers(three, {**pipes, 12: "/run/mps-b"}) == {}


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.integers(1, 8), st.builds(MpsEnd, st.none() | st.integers(0, 2),
                                                     st.frozensets(st.integers(0, 3), max_size=3)), max_size=5),
       st.dictionaries(st.integers(9, 14), st.builds(MpsEnd, st.none() | st.integers(0, 2),
                                                      st.frozensets(st.integers(0, 3), max_size=4)), max_size=4),
       st.dictionaries(st.integers(1, 14), st.sampled_from(["/a", "/b"]), max_size=10))
def test_a_named_server_always_qualifies(clients, servers, pipes):
    for client, server in mps_servers(mps_candidates(clients, servers), pipes).items():
        c, s = clients[client], servers[server]
        assert c.uid is not None and s.uid == c.uid and c.gpus and c.gpus <= s.gpus
        rivals = [x for x, e in servers.items() if e.uid == c.uid and c.gpus <= e.gpus]
        assert len(rivals) == 1 or (pipes.get(client) is not None and pipes.get(client) == pipes.get(server)
                                    and sum(pipes.get(x) == pipes.get(client) for x in rivals) == 1)
