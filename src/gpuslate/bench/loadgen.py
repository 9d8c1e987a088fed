"""The load generator of ``gpuslate bench``: one run against an OpenAI-compatible server
(SGLang, vLLM, ``gpuslate sim serve``, ...), over asyncio/aiohttp.

Laid out like vLLM's benchmark library: the plan is :mod:`.plan` (what to
send, checked before anything is sent), one request :mod:`.client` (request
-> :class:`~.metrics.RequestRecord`, the SSE stream timed), what the server
says about itself :mod:`.serverinfo` (model, engine, Prometheus counters),
when each request goes :mod:`.scheduler` (levels, arrivals, warm-ups), the
figures :mod:`.metrics`, the result :mod:`.result`. This module ties them
together: one HTTP session, the model probe, and the levels in order with
the speculative counters read between them.

Nothing is printed here; progress goes to a callback and errors are raised
as :class:`~gpuslate.errors.GpuslateError` subclasses, a bad plan before
anything is sent. ``stop`` (an asyncio event) ends a run at any point, the
model probe included, keeping what finished and listing what was in flight.
"""

from __future__ import annotations

import asyncio
import resource
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import aiohttp

from .._time import iso_time
from ..errors import UsageError
from ..extras import installed
from .client import Client
from .metrics import level_result
from .plan import LoadPlan, normalize_url
from .prompts import PromptSource, load_dataset
from .result import BenchResult, Progress
from .scheduler import Scheduler, unless_stopped
from .serverinfo import (
    CONTINUOUS_USAGE_ENGINES,
    acceptance_between,
    resolve_model,
    server_facts,
    spec_counters,
)
from .tokens import load_tokenizer

_T = TypeVar("_T")


def _ensure_fd_limit(needed: int) -> None:
    """Raise the soft open-files limit if the plan needs more sockets than it allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needed + 64
    if soft != resource.RLIM_INFINITY and soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            raise UsageError(f"{needed} concurrent requests need {want} open files; the limit is "
                             f"{hard} (ulimit -n)")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def _repeat_warning(plan: LoadPlan, prompts: PromptSource) -> str | None:
    distinct = prompts.distinct
    if distinct is None or plan.requests is None:
        return None
    if plan.requests <= distinct:
        return None
    return (f"the dataset holds {distinct} prompt(s) and a level sends {plan.requests} requests: prompts repeat "
            "(a server with a prefix cache answers repeats faster)")


async def run_bench_async(url: str, plan: LoadPlan, *,
                          on_progress: Callable[[Progress], None] | None = None,
                          stop: asyncio.Event | None = None) -> BenchResult:
    """Run ``plan`` against the server at ``url``.

    ``stop``, when set, ends the run early, at any point: requests in flight are
    abandoned (and listed), finished ones are kept, and the result says
    ``interrupted`` (this is how the CLI turns Ctrl-C and SIGTERM into partial results).
    """
    plan.validate()
    base = normalize_url(url)
    dataset = load_dataset(plan.dataset, plan.output_len) if plan.dataset else None
    tokenizer = load_tokenizer(plan.tokenizer) if plan.tokenizer else None
    _ensure_fd_limit(plan.peak_concurrency)
    started_at = iso_time(time.time())
    headers = plan.request_headers()
    # pooled: keep-alive connections reused, as vLLM's bench serve and the OpenAI SDKs; per-request: each
    # request connects inside its clock and the connection is closed after it, as SGLang's bench_serving
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, force_close=plan.connection == "per-request")
    async with aiohttp.ClientSession(connector=connector, read_bufsize=1 << 20) as session:
        result = BenchResult(base, plan.model, plan.api, started_at, plan)
        model, cut = await unless_stopped(stop, resolve_model(session, base, plan.model, headers))
        if cut:
            result.interrupted = True
            return result
        result.model = model
        server, cut = await unless_stopped(stop, server_facts(session, base, headers))
        result.server = server or {}
        if cut:
            result.interrupted = True
            return result
        prompts = PromptSource(input_len=plan.input_len, output_len=plan.output_len, seed=plan.seed,
                               dataset=dataset, range_ratio=plan.random_range_ratio)
        if (warning := _repeat_warning(plan, prompts)) is not None:
            result.warnings.append(warning)
        client = Client(session, base, plan, model or "", headers=headers, tokenizer=tokenizer,
                        continuous_usage=result.server.get("engine") in CONTINUOUS_USAGE_ENGINES)
        try:
            return await _levels(session, base, headers, plan, result, client, prompts, on_progress, stop)
        finally:
            client.close()


async def _levels(session: aiohttp.ClientSession, base: str, headers: dict[str, str], plan: LoadPlan,
                  result: BenchResult, client: Client, prompts: PromptSource,
                  on_progress: Callable[[Progress], None] | None, stop: asyncio.Event | None) -> BenchResult:
    """The plan's levels in order (each warmed up as asked), the speculative counters read around each."""
    run = Scheduler(client, plan, prompts, on_progress, stop)
    levels: list[int | None] = [None] if plan.request_rate is not None else list(plan.concurrency)
    for index, concurrency in enumerate(levels):
        if plan.warmup and (plan.warmup_each_level or index == 0):
            width = concurrency if concurrency is not None else (plan.max_concurrency or plan.warmup)
            warm = await run.warm(index, width)
            if warm.cut:
                result.interrupted = True
                result.in_flight = [{"level": index, "warmup": True, **r} for r in warm.in_flight]
                break
        before, cut = await unless_stopped(stop, spec_counters(session, base, result.server, headers))
        if cut:
            result.interrupted = True
            break
        lv = await (run.arrivals(index) if concurrency is None
                    else run.closed_loop(index, concurrency, plan.requests, plan.duration_s))
        after = None
        if not lv.cut:
            after, _ = await unless_stopped(stop, spec_counters(session, base, result.server, headers))
        acc = acceptance_between(before, after)
        if lv.records or not lv.cut:
            result.levels.append(level_result(
                lv.records, concurrency=concurrency, request_rate=plan.request_rate,
                max_concurrency=plan.max_concurrency, interrupted=lv.cut,
                accept_length=acc.all_steps, accept_length_spec=acc.spec_steps,
                spec_step_share=acc.spec_share, percentiles=plan.percentiles,
                slo=dict(plan.goodput) or None, in_flight=len(lv.in_flight), not_sent=lv.not_sent,
                stopped_early=lv.stopped_early))
        if lv.cut:
            result.interrupted = True
            result.in_flight = [{"level": index, "concurrency": concurrency, **r} for r in lv.in_flight]
            break
        if lv.stopped_early:
            break  # the server is gone: the next levels would only fail the same way
    return result


def run_bench(url: str, plan: LoadPlan, *,
              on_progress: Callable[[Progress], None] | None = None) -> BenchResult:
    """:func:`run_bench_async` in a fresh event loop (:func:`run_loop`)."""
    return run_loop(run_bench_async(url, plan, on_progress=on_progress))


def event_loop_name() -> str:
    """The event loop :func:`run_loop` runs: ``uvloop`` where the ``fast`` extra installed it, else ``asyncio``."""
    return "uvloop" if installed("uvloop") else "asyncio"


def run_loop(main: Coroutine[Any, Any, _T]) -> _T:
    """``asyncio.run(main)``, on uvloop where it is installed: its loop, in C, costs the load generator
    about a third less CPU per streamed chunk than asyncio's (benchmarks/RESULTS.md); the figures are
    the same, every time stamp being ``time.perf_counter()``."""
    if event_loop_name() == "uvloop":
        import uvloop  # lazy: optional (the fast extra)

        return uvloop.run(main)
    return asyncio.run(main)
