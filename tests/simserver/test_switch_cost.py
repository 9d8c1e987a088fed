"""The simulator's switch cost (``--switch-ms``): a step whose kind differs from the step before it
(speculation switched on or off by the threshold) pays it once, so that a collapse at the switch (vLLM
issue #49548) can be played and the recommendation's own run tested against it (tests/bench/
test_engine_experiment.py); without a threshold, or with no cost, nothing changes."""

from __future__ import annotations

import asyncio

import pytest

from gpuslate.simserver.perfmodel import PerfParams
from gpuslate.simserver.scheduler import BatchScheduler


async def _run(switch_ms: float, threshold: int | None) -> dict[str, object]:
    params = PerfParams(switch_ms=switch_ms)
    sched = BatchScheduler(params, mode="speculative", spec_disable_threshold=threshold, max_running_requests=8,
                           time_scale=2.0)  # steps of some ms: each its own event
    task = asyncio.create_task(sched.run())
    try:
        long = sched.submit(1, 40)  # alone for a while (speculative steps), then with a second one
        while long.generated < 9:
            await long.next_tokens()
        short = sched.submit(1, 5)  # batch 2 > 1: baseline steps, until it ends and the batch is 1 again
        while await short.next_tokens() is not None:
            pass
        while await long.next_tokens() is not None:
            pass
        return sched.snapshot()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_each_switch_pays_its_cost_once():
    free = asyncio.run(_run(0.0, 1))
    costly = asyncio.run(_run(50.0, 1))
    assert free["switches"] == costly["switches"] >= 2  # off when the second request came, on when it left
    extra = float(costly["busy_model_seconds"]) - float(free["busy_model_seconds"])  # type: ignore[arg-type]
    assert extra == pytest.approx(0.050 * int(costly["switches"]), rel=0.05)  # type: ignore[arg-type]


def test_no_threshold_no_switch():
    assert asyncio.run(_run(50.0, None))["switches"] == 0
    with pytest.raises(ValueError, match="switch_ms"):
        PerfParams(switch_ms=-1).validate()
