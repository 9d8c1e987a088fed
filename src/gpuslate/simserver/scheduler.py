"""The continuous-batching loop of the simulated server.

One asyncio task plays the GPU: it admits waiting requests into the running
batch, "runs" a step by sleeping for the modelled step time (divided by the
time scale), and hands every running request its tokens for that step.
The HTTP layer only submits requests and reads their token events, so all
timing lives here and in :mod:`gpuslate.simserver.perfmodel`.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from dataclasses import dataclass, field

from .perfmodel import (
    PerfParams,
    StepKind,
    TokenAccumulator,
    prefill_seconds,
    step_kind,
    step_seconds,
)

# How far the loop may fall behind its modelled clock before it gives up on
# catching up. Catching up keeps measured throughput true to the model when
# event-loop overhead is comparable to tiny (time-scaled) step times; the cap
# stops a long stall (debugger, suspended VM) from turning into a burst.
_MAX_LAG_SECONDS = 0.05
# About the event loop's timer resolution (epoll waits whole milliseconds): steps that fall due
# within it are handed out together (see BatchScheduler._flush), never later than this.
_TIMER_SECONDS = 0.001

_ids = itertools.count(1)


class SchedulerStopped(Exception):
    """The scheduler shut down before the request finished."""


@dataclass(eq=False)
class SimRequest:
    """One generation request as the scheduler sees it."""

    prompt_tokens: int
    max_tokens: int
    rid: int = field(default_factory=lambda: next(_ids))
    generated: int = 0
    pending: int = 0  # tokens generated and not yet handed to the request (see BatchScheduler._flush)
    cancelled: bool = False
    aborted: bool = False  # ended by the engine (a vLLM sleep in mode abort): finish_reason "abort"
    # Token counts per step, then None when finished (or on shutdown).
    events: asyncio.Queue[int | None] = field(default_factory=asyncio.Queue)
    stopped: bool = False
    accumulator: TokenAccumulator = field(default_factory=TokenAccumulator, repr=False)

    @property
    def finished(self) -> bool:
        return self.generated >= self.max_tokens

    async def next_tokens(self) -> int | None:
        """Tokens produced by the next step for this request; None once finished."""
        item = await self.events.get()
        if item is None and self.stopped:
            raise SchedulerStopped()
        return item


@dataclass
class Counters:
    steps: int = 0
    spec_steps: int = 0
    baseline_steps: int = 0
    total_generated_tokens: int = 0
    total_prompt_tokens: int = 0
    requests_submitted: int = 0
    requests_finished: int = 0
    requests_aborted: int = 0
    # Tokens handed out by speculative steps and request-steps they were spread
    # over: their ratio is the measured mean acceptance length (SGLang's
    # avg_spec_accept_length).
    spec_tokens: int = 0
    spec_request_steps: int = 0
    # Every request-step, speculative or not: total_generated_tokens / request_steps is the
    # acceptance length over all steps, spec_request_steps / request_steps the speculative share.
    request_steps: int = 0
    # Modelled (unscaled) seconds the simulated GPU spent in steps.
    busy_model_seconds: float = 0.0
    # Steps whose kind differed from the step before (each paid PerfParams.switch_ms).
    switches: int = 0


class BatchScheduler:
    """Continuous batching over the perf model; run :meth:`run` as one task."""

    def __init__(
        self,
        params: PerfParams,
        *,
        mode: str,
        spec_disable_threshold: int | None,
        max_running_requests: int,
        time_scale: float,
    ) -> None:
        self.params = params
        self.mode = mode
        self.spec_disable_threshold = spec_disable_threshold
        self.max_running_requests = max_running_requests
        self.time_scale = time_scale
        self.counters = Counters()
        self.last_step_batch = 0
        self.last_step_kind: StepKind | None = None
        self._waiting: deque[SimRequest] = deque()
        self._running: list[SimRequest] = []
        self._pending: dict[SimRequest, None] = {}  # requests with tokens not yet handed out, in order
        self._pending_since = 0.0  # loop time of the oldest tokens not yet handed out
        self._wake = asyncio.Event()
        self._closed = False
        # a park: no new request admitted (vLLM's PAUSED_NEW), or no step at all (PAUSED_ALL, and while
        # the driver has a worker locked); _idle is set whenever no request is running
        self._admit_paused = False
        self._frozen = False
        self._gpu_locked = False
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def submit(self, prompt_tokens: int, max_tokens: int) -> SimRequest:
        if self._closed:
            raise SchedulerStopped()
        req = SimRequest(prompt_tokens=max(1, prompt_tokens), max_tokens=max(1, max_tokens))
        self._waiting.append(req)
        self.counters.requests_submitted += 1
        self._wake.set()
        return req

    @property
    def busy(self) -> int:
        """Requests running or waiting: what SGLang's release asserts is 0."""
        return len(self._running) + len(self._waiting)

    def pause(self, *, freeze: bool) -> None:
        """Admit nothing new (running requests go on), or with ``freeze`` run no step at all."""
        self._admit_paused = True
        self._frozen = self._frozen or freeze
        self._wake.set()

    def unpause(self) -> None:
        self._admit_paused = self._frozen = False
        self._wake.set()

    @property
    def gpu_locked(self) -> bool:
        return self._gpu_locked

    def set_gpu_locked(self, locked: bool) -> None:
        """The driver holds a worker locked (or checkpointed): its GPU work waits, so does every step."""
        if locked != self._gpu_locked:
            self._gpu_locked = locked
            self._wake.set()

    async def drained(self) -> None:
        """Return once no request is running (waiting ones may stay: vLLM's sleep in mode wait)."""
        await self._idle.wait()

    def abort_all(self) -> int:
        """End every request running or waiting, as aborted (its tokens so far kept); how many."""
        ended = [*self._running, *self._waiting]
        for req in ended:
            if not req.cancelled:
                req.aborted = True
                self.counters.requests_aborted += 1
                if req.pending:
                    req.events.put_nowait(req.pending)
                    req.pending = 0
                req.events.put_nowait(None)
        self._running.clear()
        self._waiting.clear()
        self._pending.clear()
        self._idle.set()
        return len(ended)

    def cancel(self, req: SimRequest) -> None:
        """Drop a request whose client went away; it still counts in its current step."""
        if req.cancelled or req.finished:
            return
        req.cancelled = True
        self.counters.requests_aborted += 1
        try:
            self._waiting.remove(req)
        except ValueError:
            pass  # running: removed after the step it is part of

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        clock: float | None = None  # modelled end of the previous step, None when idle
        try:
            while True:
                if not self._running:
                    self._idle.set()
                if (self._frozen or self._gpu_locked
                        or (not self._running and (not self._waiting or self._admit_paused))):
                    clock = None  # an idle gap must not be "caught up" afterwards
                    self._flush()
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                prompt_tokens = 0 if self._admit_paused else self._admit()
                if self._running:
                    self._idle.clear()
                batch = len(self._running)
                kind = step_kind(self.mode, batch, self.spec_disable_threshold)
                model_seconds = step_seconds(kind, batch, self.params)
                if self.last_step_kind is not None and kind != self.last_step_kind:
                    model_seconds += self.params.switch_ms / 1000.0  # speculation switched on or off
                    self.counters.switches += 1
                model_seconds += prefill_seconds(prompt_tokens, self.params)
                now = loop.time()
                if clock is None or now - clock > _MAX_LAG_SECONDS:
                    clock = now
                clock += model_seconds / self.time_scale
                if clock > now or (self._pending and now - self._pending_since >= _TIMER_SECONDS):
                    self._flush()  # the steps run so far are out before the loop sleeps
                if clock > now:
                    await asyncio.sleep(clock - now)
                else:  # due already: the HTTP layer may run (new requests, cancels)
                    await asyncio.sleep(0)
                self._finish_step(kind, batch, model_seconds, prompt_tokens)
                if not self._running and not self._waiting:
                    self._flush()
        finally:
            self._close()

    def _flush(self) -> None:
        """Hand each request the tokens of the steps run since the last flush, as one event.

        A step already due when it starts (the loop is catching up on its modelled clock, at a
        time scale where a step is shorter than the event loop's timer, about a millisecond)
        runs without a pause: its tokens join the previous step's (for at most
        :data:`_TIMER_SECONDS`), like a real server's stream interval, instead of a chunk of
        their own sent the same instant, which a client would measure as an inter-token
        latency of 0 (``bench`` at ``--time-scale 10`` showed an ITL p50 of 0.00 ms)."""
        for req in self._pending:
            if req.pending:
                req.events.put_nowait(req.pending)
                req.pending = 0
            if req.finished:
                req.events.put_nowait(None)
        self._pending.clear()

    def _admit(self) -> int:
        prompt_tokens = 0
        while self._waiting and len(self._running) < self.max_running_requests:
            req = self._waiting.popleft()
            self._running.append(req)
            prompt_tokens += req.prompt_tokens
        return prompt_tokens

    def _finish_step(self, kind: StepKind, batch: int, model_seconds: float, prompt_tokens: int) -> None:
        c = self.counters
        c.steps += 1
        if kind == "spec":
            c.spec_steps += 1
        else:
            c.baseline_steps += 1
        c.busy_model_seconds += model_seconds
        c.total_prompt_tokens += prompt_tokens
        self.last_step_batch = batch
        self.last_step_kind = kind
        still_running: list[SimRequest] = []
        for req in self._running:
            if req.cancelled:
                continue
            n = min(req.accumulator.take(kind, self.params), req.max_tokens - req.generated)
            req.generated += n
            c.total_generated_tokens += n
            c.request_steps += 1
            if kind == "spec":
                c.spec_tokens += n
                c.spec_request_steps += 1
            if not self._pending:
                self._pending_since = asyncio.get_running_loop().time()
            self._pending[req] = None
            req.pending += n
            if req.finished:
                c.requests_finished += 1
            else:
                still_running.append(req)
        self._running = still_running

    def _close(self) -> None:
        # Wake every waiting handler so none hangs on a scheduler that is gone.
        self._closed = True
        for req in [*self._running, *self._waiting]:
            req.stopped = True
            req.events.put_nowait(None)
        self._running.clear()
        self._waiting.clear()

    def snapshot(self) -> dict[str, object]:
        c = self.counters
        return {
            "running": self.running,
            "waiting": self.waiting,
            "last_step_batch": self.last_step_batch,
            "last_step_kind": self.last_step_kind,
            "steps": c.steps,
            "spec_steps": c.spec_steps,
            "baseline_steps": c.baseline_steps,
            "total_generated_tokens": c.total_generated_tokens,
            "total_prompt_tokens": c.total_prompt_tokens,
            "requests_submitted": c.requests_submitted,
            "requests_finished": c.requests_finished,
            "requests_aborted": c.requests_aborted,
            "busy_model_seconds": round(c.busy_model_seconds, 6),
            "switches": c.switches,
            # Raw sums behind avg_spec_accept_length: clients diff them to get the
            # acceptance length of one stretch of load (gpuslate bench, per level).
            "spec_tokens": c.spec_tokens,
            "spec_request_steps": c.spec_request_steps,
            "request_steps": c.request_steps,
            "avg_spec_accept_length": self.avg_spec_accept_length,
        }

    @property
    def avg_spec_accept_length(self) -> float:
        c = self.counters
        return round(c.spec_tokens / c.spec_request_steps, 4) if c.spec_request_steps else 0.0
