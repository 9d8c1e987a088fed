"""The leak verdict of ``clear``, ``wait``, ``down`` and the Slurm hooks as a function of readings
and time: memory held by no process, nothing listed that could free it, not going down for the
settle time. Unknown memory never makes a leak; a teardown (memory going down) restarts the wait."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslate.clearing.wait import LEAK_SETTLE_S, LeakWatch
from gpuslate.gpu.types import GpuProcess, GpuReading, MemoryInfo, held_by_no_process

GiB = 1024**3
MAX_USED = 64 << 20


def reading(gpu: int, used: int | None, procs: list[GpuProcess] | None = None) -> GpuReading:
    memory = MemoryInfo(96 * GiB, used, 0, 96 * GiB - used) if used is not None else None
    return GpuReading(index=gpu, name="H200", minor=gpu, memory=memory,
                      processes=[] if procs is None and used is not None else procs,
                      error=None if used is not None else "lost")


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_held_by_no_process_is_used_minus_what_the_listed_processes_hold() -> None:
    assert held_by_no_process(reading(0, 5 * GiB, [GpuProcess(1, "compute", 2 * GiB)])) == 3 * GiB
    assert held_by_no_process(reading(0, GiB, [GpuProcess(1, "compute", 2 * GiB)])) == 0
    assert held_by_no_process(reading(0, 2 * GiB, [GpuProcess(1, "compute", None)])) == 2 * GiB
    assert held_by_no_process(reading(0, None)) is None


def test_verdict_after_the_settle_time_and_a_teardown_restarts_it() -> None:
    clock = Clock()
    watch = LeakWatch(MAX_USED, clock=clock)
    nothing = lambda r: False  # noqa: E731
    assert not watch([reading(0, 4 * GiB)], nothing)
    clock.t = 0.6
    assert not watch([reading(0, 3 * GiB)], nothing)  # going down: a teardown still running
    clock.t = 0.6 + LEAK_SETTLE_S - 0.01
    assert not watch([reading(0, 3 * GiB)], nothing)
    clock.t = 0.6 + LEAK_SETTLE_S
    assert watch([reading(0, 3 * GiB)], nothing)
    # a process listed that could free it, or memory unknown: no verdict, and the wait starts over
    assert not watch([reading(0, 3 * GiB, [GpuProcess(7, "compute", None)])], lambda r: bool(r.processes))
    clock.t += 0.5
    assert not watch([reading(0, 3 * GiB)], nothing)
    assert not watch([reading(0, None)], nothing)
    assert not watch([], nothing)  # nothing pending: nothing to say


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 0.5), st.one_of(st.none(), st.integers(0, 8 * GiB)), st.booleans()),
                max_size=30))
def test_no_verdict_without_the_settle_time_of_unknown_free_memory(polls) -> None:
    clock = Clock()
    watch = LeakWatch(MAX_USED, clock=clock)
    since: float | None = None
    least = None
    for dt, used, listed in polls:
        clock.t += dt
        r = reading(1, used, [GpuProcess(9, "compute", 0)] if listed and used is not None else None)
        verdict = watch([r], lambda x: bool(x.processes))
        left = held_by_no_process(r)
        if left is None or left <= MAX_USED or listed:
            since = least = None
            assert not verdict
            continue
        if since is None or left < least:
            since, least = clock.t, left
        assert verdict == (clock.t - since >= LEAK_SETTLE_S)
