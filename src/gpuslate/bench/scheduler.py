"""When ``gpuslate bench`` sends each request: the scheduler of a level.

A closed-loop level keeps ``c`` requests in flight until it has sent its
requests or its time is up; an arrival level sends at ``request_rate``
(gamma-distributed gaps, vLLM's ``get_request``), optionally capped at
``max_concurrency`` in flight; a warm-up is a short closed-loop level. A
level stops early when the server is gone (``max_connection_failures``
connection failures in a row): what it did not send is counted as not sent,
not fired at a dead port. ``stop`` (an asyncio event) cuts any of them short,
keeping what finished and listing what was in flight.

One request is :mod:`.client`; the plan :mod:`.plan`; the run that ties them
to a server :mod:`.loadgen`.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .client import Client, is_connection_failure
from .metrics import RequestRecord
from .plan import LoadPlan
from .prompts import Prompt, PromptSource
from .result import Progress

_T = TypeVar("_T")


@dataclass
class LevelRun:
    """What one level (or warm-up) did: its records, whether it was cut, what it did not send."""

    records: list[RequestRecord]
    cut: bool = False
    not_sent: int = 0
    in_flight: list[dict[str, Any]] = field(default_factory=list)
    stopped_early: str | None = None


class _Gone:
    """Counts connection failures in a row; once there are enough, the server is gone."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.run = 0
        self.why: str | None = None

    def see(self, rec: RequestRecord) -> None:
        if is_connection_failure(rec):
            self.run += 1
            if self.run >= self.limit and self.why is None:
                self.why = f"server gone: {self.run} connection failures in a row ({rec.error})"
        else:
            self.run = 0


class Scheduler:
    """When each request of a level is sent: closed-loop levels, arrivals, warm-ups (vLLM's
    ``benchmark`` loop and ``get_request``), each cut short by ``stop`` or a gone server."""

    def __init__(self, client: Client, plan: LoadPlan, prompts: PromptSource,
                 on_progress: Callable[[Progress], None] | None, stop: asyncio.Event | None) -> None:
        self.client = client
        self.plan = plan
        self.prompts = prompts
        self.on_progress = on_progress
        self.stop = stop
        self.levels = 1 if plan.request_rate is not None else len(plan.concurrency)

    def _report(self, index: int, concurrency: int | None, done: int, total: int | None,
                t0: float, warmup: bool = False, finished: bool = False) -> None:
        if self.on_progress is not None:
            self.on_progress(Progress(index, self.levels, concurrency, done, total,
                                      time.perf_counter() - t0, warmup, finished))

    async def _until_stopped(self, work: list[asyncio.Task[None]]) -> tuple[bool, list[dict[str, Any]]]:
        """Wait for ``work``; (True, what was in flight) if the stop event cut it short."""
        if not work:
            return False, []
        gathered = asyncio.gather(*work)
        # Once the workers are cancelled the gather holds a CancelledError: mark it seen.
        gathered.add_done_callback(lambda f: f.cancelled() or f.exception())
        waiters: set[asyncio.Future[Any]] = {gathered}
        stopper = asyncio.ensure_future(self.stop.wait()) if self.stop is not None else None
        if stopper is not None:
            waiters.add(stopper)
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            for task in work:
                task.cancel()
            raise
        finally:
            if stopper is not None:
                stopper.cancel()
        if gathered.done():
            gathered.result()  # re-raise a bug in a worker
            return False, []
        in_flight = self.client.in_flight_now()
        for task in work:
            task.cancel()
        await asyncio.gather(*work, return_exceptions=True)
        return True, in_flight

    async def closed_loop(self, index: int, concurrency: int, requests: int | None,
                          duration_s: float | None, warmup: bool = False) -> LevelRun:
        level = LevelRun([])
        records = level.records
        issued = 0
        gone = _Gone(self.plan.max_connection_failures)
        t0 = time.perf_counter()
        stop_at = None if duration_s is None else t0 + duration_s
        self._report(index, concurrency, 0, requests, t0, warmup)

        async def worker() -> None:
            nonlocal issued
            while (requests is None or issued < requests) and gone.why is None and \
                    (stop_at is None or time.perf_counter() < stop_at):
                issued += 1
                rec = await self.client.send(self.prompts.take())
                records.append(rec)
                gone.see(rec)
                self._report(index, concurrency, len(records), requests, t0, warmup)

        work = [asyncio.ensure_future(worker()) for _ in range(concurrency)]
        level.cut, level.in_flight = await self._until_stopped(work)
        if requests is not None:
            level.not_sent = requests - issued
        level.stopped_early = gone.why
        self._report(index, concurrency, len(records), requests, t0, warmup, finished=True)
        return level

    async def arrivals(self, index: int) -> LevelRun:
        """Requests at ``request_rate``: gamma-distributed gaps of shape ``burstiness`` (1:
        Poisson), the mean gap 1 / rate, as vLLM's ``get_request``; inf: all at once."""
        plan = self.plan
        assert plan.request_rate is not None
        rate, shape = plan.request_rate, plan.burstiness
        rng = random.Random(plan.seed)
        limit = asyncio.Semaphore(plan.max_concurrency) if plan.max_concurrency else None
        level = LevelRun([])
        records = level.records
        gone = _Gone(plan.max_connection_failures)
        t0 = time.perf_counter()
        stop_at = None if plan.duration_s is None else t0 + plan.duration_s
        self._report(index, None, 0, plan.requests, t0)
        issued = 0

        async def one(prompt: Prompt) -> None:
            if limit is None:
                rec = await self.client.send(prompt)
            else:
                async with limit:  # vLLM's max_concurrency: the arrival waits for a slot
                    rec = await self.client.send(prompt)
            records.append(rec)
            gone.see(rec)
            self._report(index, None, len(records), plan.requests, t0)

        async def arrive() -> None:
            nonlocal issued
            sent: list[asyncio.Task[None]] = []
            next_at = t0
            while (plan.requests is None or len(sent) < plan.requests) and gone.why is None:
                delay = next_at - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                if stop_at is not None and time.perf_counter() >= stop_at:
                    break
                sent.append(asyncio.ensure_future(one(self.prompts.take())))
                issued += 1
                if math.isfinite(rate):
                    next_at += rng.gammavariate(shape, 1.0 / (rate * shape))
                else:
                    await asyncio.sleep(0)  # let the request start before the next is made
            try:
                await asyncio.gather(*sent)
            finally:
                for task in sent:
                    task.cancel()

        level.cut, level.in_flight = await self._until_stopped([asyncio.ensure_future(arrive())])
        if plan.requests is not None:
            level.not_sent = plan.requests - issued
        level.stopped_early = gone.why
        self._report(index, None, len(records), plan.requests, t0, finished=True)
        return level

    async def warm(self, index: int, concurrency: int) -> LevelRun:
        return await self.closed_loop(index, min(concurrency, self.plan.warmup), self.plan.warmup, None,
                                      warmup=True)


async def unless_stopped(stop: asyncio.Event | None, coro: Awaitable[_T]) -> tuple[_T | None, bool]:
    """Await ``coro`` unless ``stop`` is set first (then it is cancelled): (value, stopped)."""
    task = asyncio.ensure_future(coro)
    if stop is None:
        return await task, False
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    if task.done():
        return task.result(), False
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return None, True
