"""A daemon's baseline and an MPS client's server, as pure functions: what widens "free" is only a
spared daemon's reported memory within the bound, and a server is named only when one qualifies."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslate.clearing.wait import is_free
from gpuslate.gpu.types import GpuProcess, GpuReading, MemoryInfo
from gpuslate.host.daemons import BASELINE_MAX, DaemonHold, MpsEnd, baseline, mps_candidates, mps_servers, sharing

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
    # more than a daemon's baseline
    assert not is_free(reading(BASELINE_MAX + MiB, [GpuProcess(42, "compute", BASELINE_MAX + MiB)]), 64 * MiB, daemons)
    # a failed query
    assert not is_free(reading(0, [GpuProcess(42, "compute", 66 * MiB)], error="x"), 64 * MiB, daemons)
    # memory beyond the daemon's own figure still counts
    assert not is_free(reading(200 * MiB, [GpuProcess(42, "compute", 66 * MiB)]), 64 * MiB, daemons)


_procs = st.lists(st.builds(GpuProcess, st.integers(1, 12), st.sampled_from(["compute", "mps", "graphics"]),
                            st.none() | st.integers(0, 2 * BASELINE_MAX)), max_size=5, unique_by=lambda p: p.pid)


@settings(max_examples=300, deadline=None)
@given(_procs, st.integers(0, 4 * BASELINE_MAX), st.dictionaries(st.integers(1, 12), st.just(SERVER), max_size=4),
       st.integers(0, BASELINE_MAX))
def test_daemons_only_widen_free_by_their_reported_bounded_memory(procs, used, daemons, max_used):
    r = reading(used, procs)
    base = baseline(0, [(p.pid, p.used_memory) for p in procs], daemons)
    assert all(h.pid in daemons and 0 <= h.bytes <= BASELINE_MAX for h in base)
    assert {h.pid for h in base} == {p.pid for p in procs if p.pid in daemons and p.used_memory is not None
                                     and p.used_memory <= BASELINE_MAX}
    if is_free(r, max_used):
        assert is_free(r, max_used, daemons)  # knowing daemons never narrows free
    if is_free(r, max_used, daemons):
        held = {h.pid for h in base}
        assert all(p.pid in held for p in procs)  # every listed process is a bounded daemon
        assert used - sum(h.bytes for h in base) <= max_used
        assert used <= max_used + len(procs) * BASELINE_MAX


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
