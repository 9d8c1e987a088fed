"""The pure decisions of parking: how a unit parks (``choose``), what it may keep (``residue_of``),
what the engine's running check says (``count_running``), and the states ``ps`` names
(``unit_state`` with a park phase): ``hypothesis`` invariants over every combination of facts."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpuslate.engines import BACKENDS, ParkLevel, read_park
from gpuslate.engines.base import RunningCheck
from gpuslate.gpu.types import HostMemory
from gpuslate.options import ParkWay
from gpuslate.units.park import Candidates, choose, count_running, residue_of
from gpuslate.units.state import ParkPhase, Phase, UnitFacts, UnitState, unit_state

GiB = 1024**3
DEV = {"VLLM_SERVER_DEV_MODE": "1"}
VLLM = ["vllm", "serve", "m", "--enable-sleep-mode"]
EAGLE = [*VLLM, "--speculative-config", '{"method": "eagle3", "model": "d", "num_speculative_tokens": 3}']
SGLANG = ["python", "-m", "sglang.launch_server", "--model-path", "m", "--enable-memory-saver"]

readings = st.sampled_from([
    None, read_park(VLLM, DEV), read_park(VLLM, {}), read_park(EAGLE, DEV), read_park([*EAGLE, "--enforce-eager"], DEV),
    read_park(SGLANG, {}), read_park([*SGLANG, "--enable-weights-cpu-backup"], {}),
    read_park(["vllm", "serve", "m"], DEV),
])
cuda = st.dictionaries(st.integers(1, 9), st.dictionaries(st.integers(0, 3), st.integers(1, 80 * GiB), min_size=1,
                                                          max_size=2), max_size=3)
hosts = st.one_of(st.none(), st.builds(lambda t, f: HostMemory(t, int(t * f)), st.integers(16 * GiB, 4096 * GiB),
                                       st.floats(0, 1)))


@given(st.sampled_from(list(ParkWay)), readings, cuda, st.sampled_from([None, "the driver says no"]), hosts)
def test_choose_is_total_and_never_chooses_what_a_guard_refuses(wanted, reading, procs, ckpt, host):
    c = choose(wanted, Candidates(reading, procs, ckpt, host))
    assert c.why
    if c.way is None:
        return
    assert wanted in (ParkWay.AUTO, c.way) and c.way is not ParkWay.NONE
    held = sum(b for gpus in procs.values() for b in gpus.values())
    if c.way is ParkWay.CHECKPOINT:
        # one CUDA process, a driver that can, and every byte of it fits in host memory with the margin
        assert len(procs) == 1 and ckpt is None and c.level is None and c.moving == held
    else:
        assert reading is not None and not reading.missing and isinstance(c.level, ParkLevel)
        assert c.level in reading.usable()  # a level its flags give, no known hazard
        assert c.moving == (held if c.level.offloads else 0)
    if c.moving:
        assert host is not None and c.moving + max(8 * GiB, host.total // 10) <= host.available


def test_auto_prefers_the_engines_level_1_then_2_then_the_checkpoint():
    big = HostMemory(2048 * GiB, 2048 * GiB)
    one = {7: {0: 20 * GiB}}
    assert choose(ParkWay.AUTO, Candidates(read_park(VLLM, DEV), one, None, big)).way is ParkWay.LEVEL1
    small = HostMemory(32 * GiB, 24 * GiB)  # the weights would not fit: level 2 moves nothing
    assert choose(ParkWay.AUTO, Candidates(read_park(VLLM, DEV), one, None, small)).way is ParkWay.LEVEL2
    c = choose(ParkWay.AUTO, Candidates(read_park(VLLM, {}), one, None, big))
    assert c.way is ParkWay.CHECKPOINT and "VLLM_SERVER_DEV_MODE" in c.why
    c = choose(ParkWay.AUTO, Candidates(None, {7: {0: 1}, 8: {1: 1}}, None, big))
    assert c.way is None and "2 CUDA processes" in c.why
    assert choose(ParkWay.NONE, Candidates(read_park(VLLM, DEV), one, None, big)).way is None
    # an explicit level 2 under a hazard: refused with its source, and what to use instead
    c = choose(ParkWay.LEVEL2, Candidates(read_park(EAGLE, DEV), one, None, big))
    assert c.way is None and "vLLM #55013" in c.why and "level 1 or a restart" in c.why


def test_residue_is_nothing_for_the_checkpoint_and_bounded_for_an_engine():
    park = BACKENDS["vllm"].park
    held = {(1, 0): 100 * GiB, (1, 1): 10 * GiB}
    assert residue_of(ParkWay.CHECKPOINT, park, held) == {(1, 0): 0, (1, 1): 0}
    assert residue_of(ParkWay.LEVEL1, park, held) == {(1, 0): park.residue_cap, (1, 1): GiB}


def test_count_running_reads_the_engines_forms():
    prom = RunningCheck(BACKENDS["vllm"].park.running.call, prometheus=("a", "b"))
    assert count_running(prom, 200, b'# TYPE a gauge\na{m="x"} 2.0\nb{m="x"} 1.0\nc 9\n') == 3
    assert count_running(prom, 200, b"c 9\n") is None and count_running(prom, 404, b"a 0") is None
    keys = RunningCheck(BACKENDS["sglang"].park.running.call, keys=("num_reqs",))
    assert count_running(keys, 200, b'[{"num_reqs": 2}, {"num_reqs": 1}]') == 3
    assert count_running(keys, 200, b'{"num_reqs": 0}') == 0
    assert count_running(keys, 200, b'[{"num_reqs": true}]') is None and count_running(keys, 200, b"[]") is None


@given(st.sampled_from(list(ParkPhase)), st.booleans(), st.booleans(), st.booleans())
def test_a_park_phase_is_named_while_the_unit_lives(phase, by_alive, main_alive, members_alive):
    f = UnitFacts(Phase.READY, main_alive, members_alive or main_alive, False, None, (), phase, by_alive)
    s = unit_state(f)
    if not main_alive:
        assert s in (UnitState.ORPHANED, UnitState.EXITED)  # its server is gone: the park does not matter
    elif phase is ParkPhase.PARKED:
        assert s is UnitState.PARKED
    elif phase is ParkPhase.BROKEN:
        assert s is UnitState.BROKEN
    elif not by_alive:
        assert s is UnitState.INTERRUPTED  # cut short: resume or down ends it
    else:
        assert s in (UnitState.PARKING, UnitState.RESUMING)
    # a stopped unit is stopped, whatever a park left in its record
    stopped = unit_state(UnitFacts(Phase.STOPPED, False, False, False, None, (), phase, by_alive))
    assert stopped is UnitState.STOPPED
