"""The park proof and the host-memory guard are pure: model tests over generated readings."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslate.gpu.types import GpuProcess, GpuReading, HostMemory, MemoryInfo, ProcessKind
from gpuslate.units.parkproof import HOST_MARGIN_BYTES, ParkMethod, host_memory_fits, prove_parked

GiB = 1024**3
TOTAL = 96 * GiB
UNIT = (101, 102)  # the unit's processes
OTHER = 900  # someone else's


def reading(gpu: int, procs: dict[int, int | None], extra: int = 0, error: str | None = None) -> GpuReading:
    if error:
        return GpuReading(index=gpu, error=error)
    used = sum(v or 0 for v in procs.values()) + extra
    return GpuReading(index=gpu, minor=gpu, memory=MemoryInfo(TOTAL, used, 0, TOTAL - used),
                      processes=[GpuProcess(pid, ProcessKind.COMPUTE, mem) for pid, mem in sorted(procs.items())])


held = st.integers(min_value=0, max_value=40 * GiB)
after_state = st.fixed_dictionaries({pid: st.one_of(st.none(), held) for pid in UNIT})  # None: not listed


@st.composite
def park(draw: st.DrawFn) -> tuple[list[GpuReading], list[GpuReading], dict[tuple[int, int], int], ParkMethod]:
    gpus = draw(st.integers(1, 3))
    before = [reading(g, dict.fromkeys(UNIT, 20 * GiB)) for g in range(gpus)]
    after = []
    for g in range(gpus):
        procs = {pid: mem for pid, mem in draw(after_state).items() if mem is not None}
        if draw(st.booleans()):
            procs[OTHER] = draw(held)
        after.append(reading(g, procs, extra=draw(st.sampled_from([0, 0, GiB]))))
    residue = {(pid, g): draw(st.sampled_from([0, GiB, 2 * GiB])) for pid in UNIT for g in range(gpus)}
    return before, after, residue, draw(st.sampled_from(list(ParkMethod)))


def unit_after(after: list[GpuReading]) -> dict[tuple[int, int], int]:
    return {(p.pid, r.index): p.used_memory or 0 for r in after for p in r.processes or [] if p.pid in UNIT}


@settings(max_examples=300)
@given(park())
def test_parked_exactly_when_the_unit_kept_its_residue_and_the_gpus_are_free(case) -> None:
    before, after, residue, method = case
    gpus = [r.index for r in before]
    proof = prove_parked(before, after, UNIT, gpus, method, residue=residue)
    kept = unit_after(after)
    if method is ParkMethod.CHECKPOINT:
        procs_ok = not kept  # the checkpoint: gone from every list
        allowed = 0
    else:
        procs_ok = all(v <= residue[k] for k, v in kept.items())
        allowed = sum(min(v, residue[k]) for k, v in kept.items())
    used = sum(r.memory.used for r in after)
    others = used - sum(kept.values())
    expect = procs_ok and all(
        r.memory.used - sum(min(v, 0 if method is ParkMethod.CHECKPOINT else residue[(pid, g)])
                            for (pid, g), v in kept.items() if g == r.index) <= 0 for r in after)
    assert proof.parked is expect, proof.problems
    assert proof.parked == (not proof.problems)
    if others > 0:  # memory no process of the unit may keep: never parked
        assert not proof.parked
    for f in proof.processes:  # a figure for each process and GPU, with what it kept
        assert f.after == kept.get((f.pid, f.gpu)) and f.before == 20 * GiB
    assert allowed <= used or not proof.parked


@given(park(), st.integers(0, 2), st.sampled_from(["NVML_ERROR_GPU_IS_LOST", None]))
def test_an_unread_gpu_is_never_proven(case, which: int, error: str | None) -> None:
    before, after, residue, method = case
    which %= len(after)
    broken = list(after)
    broken[which] = reading(which, {}, error=error or "x") if error else \
        broken[which]._replace(memory=None, processes=None)
    proof = prove_parked(before, broken, UNIT, [r.index for r in before], method, residue=residue)
    assert not proof.parked
    assert any(f"GPU {which}" in p for p in proof.problems)


@given(park(), st.sampled_from(UNIT))
def test_memory_not_reported_per_process_is_never_taken_for_none(case, pid: int) -> None:
    before, after, residue, _ = case
    a = [r._replace(processes=[*(p for p in r.processes if p.pid != pid), GpuProcess(pid, "compute", None)])
         for r in after]
    proof = prove_parked(before, a, UNIT, [r.index for r in before], ParkMethod.ENGINE, residue=residue)
    assert not proof.parked


@given(park(), st.integers(1, 4 * GiB))
def test_holding_more_never_turns_a_failure_into_a_park(case, more: int) -> None:
    before, after, residue, method = case
    gpus = [r.index for r in before]
    first = prove_parked(before, after, UNIT, gpus, method, residue=residue)
    grown = [r._replace(processes=[p._replace(used_memory=(p.used_memory or 0) + more) if p.pid in UNIT else p
                                   for p in r.processes],
                        memory=r.memory._replace(used=r.memory.used + more * sum(p.pid in UNIT for p in r.processes)))
             for r in after]
    again = prove_parked(before, grown, UNIT, gpus, method, residue=residue)
    assert not (again.parked and not first.parked)


def test_a_gpu_the_unit_held_before_is_checked_though_not_named() -> None:
    before = [reading(0, {101: 20 * GiB}), reading(5, {101: 20 * GiB})]
    after = [reading(0, {}), reading(5, {101: 20 * GiB})]
    proof = prove_parked(before, after, [101], [0], ParkMethod.CHECKPOINT)
    assert not proof.parked and proof.problems == ("pid 101 is still on GPU 5's list after its checkpoint (20.0 GiB)",
                                                   "GPU 5: 20.0 GiB used after the park, more than the unit may keep "
                                                   "(0 B) and the threshold (0 B)")


def test_the_daemons_baseline_and_max_used_are_wait_free_s() -> None:
    before = [reading(0, {101: 20 * GiB})]
    after = [reading(0, {101: GiB}, extra=66 * 1024**2)]  # a context of 1 GiB, an MPS server's 66 MiB
    residue = {(101, 0): GiB}
    assert not prove_parked(before, after, [101], [0], ParkMethod.ENGINE, residue=residue).parked
    assert prove_parked(before, after, [101], [0], ParkMethod.ENGINE, residue=residue,
                        baseline={0: 66 * 1024**2}).parked
    assert prove_parked(before, after, [101], [0], ParkMethod.ENGINE, residue=residue, max_used=100 * 1024**2).parked


# -- the host-memory guard --------------------------------------------------------------
hosts = st.builds(lambda total, frac: HostMemory(total, int(total * frac)),
                  st.integers(16 * GiB, 4096 * GiB), st.floats(0, 1))


@given(st.integers(0, 2048 * GiB), st.integers(0, 2048 * GiB), hosts)
def test_host_guard_is_monotone_and_keeps_its_margin(a: int, b: int, host: HostMemory) -> None:
    small, large = sorted((a, b))
    fit_small, fit_large = host_memory_fits(small, host), host_memory_fits(large, host)
    assert not (fit_large.fits and not fit_small.fits)  # moving more never fits where less does not
    if fit_large.fits and large > 0:
        assert host.available - large >= max(HOST_MARGIN_BYTES, host.total // 10)
    richer = HostMemory(host.total, host.total)
    assert not (fit_large.fits and not host_memory_fits(large, richer).fits)


@given(st.integers(1, 2048 * GiB))
def test_unknown_host_memory_never_fits_and_nothing_moving_always_does(moving: int) -> None:
    assert not host_memory_fits(moving, None).fits
    assert host_memory_fits(0, None).fits
    assert "unknown" in host_memory_fits(moving, None).why
