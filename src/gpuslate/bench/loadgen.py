"""The load generator of ``gpuslate bench``: an asyncio/aiohttp client for
OpenAI-compatible servers (SGLang, vLLM, ``gpuslate sim serve``, ...).

A *plan* is a list of closed-loop concurrency levels, run one after another
(each level keeps ``c`` requests in flight until it has sent its requests or
its time is up), or an arrival process at ``request_rate`` requests/s
(Poisson, or gamma with ``burstiness``; ``inf``: all at once, vLLM's rule)
optionally capped at ``max_concurrency`` in flight. Each level is preceded by
``warmup`` requests at its own concurrency (a continuous-batching server is
slow the first time it sees a batch size), left out of the figures.

One request is :mod:`gpuslate.bench.client`, what the server says about
itself :mod:`gpuslate.bench.serverinfo`, the figures
:mod:`gpuslate.bench.metrics`. A level stops early when the server is gone
(``max_connection_failures`` connection failures in a row): the requests it
did not send are counted as not sent, not fired at a dead port.

Nothing is printed here; progress goes to a callback and errors are raised
as :class:`~gpuslate.errors.GpuslateError` subclasses, a bad plan before
anything is sent. ``stop`` (an asyncio event) ends a run at any point, the
model probe included, keeping what finished and listing what was in flight.
"""

from __future__ import annotations

import asyncio
import math
import random
import resource
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Awaitable, Callable, Literal, TypeVar
from urllib.parse import urlsplit

import aiohttp

from .. import __version__
from .._time import iso_time
from ..errors import UsageError
from .client import Client, is_connection_failure
from .metrics import DEFAULT_PERCENTILES, LevelResult, RequestRecord, Slo, level_result
from .prompts import Prompt, PromptSource, load_dataset
from .serverinfo import (CONTINUOUS_USAGE_ENGINES, acceptance_between, resolve_model, server_facts,
                         spec_counters)
from .tokens import load_tokenizer

_T = TypeVar("_T")
Api = Literal["completions", "chat"]
APIS: tuple[str, ...] = ("completions", "chat")

# Bounds that keep a typo from becoming a runaway run (or a socket storm).
MAX_CONCURRENCY = 10_000
MAX_REQUESTS = 10_000_000
MAX_LEN = 1_000_000
MAX_DURATION_S = 7 * 24 * 3600.0
MAX_RATE = 1_000_000.0
MAX_BURSTINESS = 1000.0
MAX_HEADER_CHARS = 8192


@dataclass(frozen=True)
class LoadPlan:
    """What to send; see docs/bench.md. Validated by :meth:`validate` before anything is sent."""

    concurrency: tuple[int, ...] = (1,)  # closed-loop levels, one after another
    request_rate: float | None = None  # arrivals instead (then concurrency is ignored); inf: all at once
    max_concurrency: int | None = None
    requests: int | None = 64  # per level (None with duration_s)
    duration_s: float | None = None
    warmup: int = 0  # requests before each level, at its concurrency (or before the first only)
    warmup_each_level: bool = True
    seed: int = 0
    api: Api = "completions"
    stream: bool = True
    input_len: int = 128
    output_len: int = 128
    dataset: str | None = None
    model: str | None = None  # None: ask GET /v1/models and use the first
    ignore_eos: bool = True
    timeout_s: float = 600.0  # per request
    burstiness: float = 1.0  # gamma shape of the arrivals: 1 Poisson, < 1 burstier, > 1 steadier
    random_range_ratio: float = 0.0  # random prompt/output lengths within L * (1 -/+ r)
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
    goodput: tuple[tuple[Slo, float], ...] = ()  # objectives in ms: (ttft|tpot|e2e, limit)
    extra_body: dict[str, Any] = field(default_factory=dict)  # merged into every request body
    headers: tuple[tuple[str, str], ...] = ()
    api_key: str | None = field(default=None, repr=False)  # sent as Authorization: Bearer
    tokenizer: str | None = None  # count tokens with it when the server reports no usage
    max_connection_failures: int = 8  # in a row: the server is gone, the level stops

    def validate(self) -> None:
        """Raise :class:`UsageError` (one line) on the first bad value."""
        if self.request_rate is None:
            if not self.concurrency:
                raise UsageError("no concurrency levels given")
            for c in self.concurrency:
                _check_int("concurrency", c, 1, MAX_CONCURRENCY)
        else:
            if isinstance(self.request_rate, bool) or not isinstance(self.request_rate, (int, float)) \
                    or math.isnan(self.request_rate) or not 0 < self.request_rate \
                    or (math.isfinite(self.request_rate) and self.request_rate > MAX_RATE):
                raise UsageError(f"request rate must be a number within (0, {MAX_RATE:g}] or inf, "
                                 f"got {self.request_rate!r}")
            if math.isinf(self.request_rate) and self.requests is None:
                raise UsageError("--request-rate inf sends every request at once: give --requests")
        if self.max_concurrency is not None:
            _check_int("max concurrency", self.max_concurrency, 1, MAX_CONCURRENCY)
        if self.requests is None and self.duration_s is None:
            raise UsageError("give a number of requests per level or a duration")
        if self.requests is not None:
            _check_int("requests", self.requests, 1, MAX_REQUESTS)
        if self.duration_s is not None:
            _check_float("duration", self.duration_s, MAX_DURATION_S)
        _check_int("warmup", self.warmup, 0, MAX_REQUESTS)
        _check_int("seed", self.seed, 0, 2**63 - 1)
        if self.api not in APIS:
            raise UsageError(f"api must be one of {', '.join(APIS)}, got {self.api!r}")
        _check_int("input length", self.input_len, 1, MAX_LEN)
        _check_int("output length", self.output_len, 1, MAX_LEN)
        _check_float("timeout", self.timeout_s, MAX_DURATION_S)
        if self.model is not None and not self.model:
            raise UsageError("model name must not be empty")
        if isinstance(self.burstiness, bool) or not isinstance(self.burstiness, (int, float)) \
                or not math.isfinite(self.burstiness) or not 0 < self.burstiness <= MAX_BURSTINESS:
            raise UsageError(f"burstiness must be a number within (0, {MAX_BURSTINESS:g}], got {self.burstiness!r}")
        if isinstance(self.random_range_ratio, bool) or not isinstance(self.random_range_ratio, (int, float)) \
                or not 0 <= self.random_range_ratio < 1:
            raise UsageError(f"random range ratio must be within [0, 1), got {self.random_range_ratio!r}")
        if not self.percentiles or any(isinstance(q, bool) or not isinstance(q, (int, float))
                                       or not 0 <= q <= 100 for q in self.percentiles):
            raise UsageError(f"percentiles must be numbers within 0..100, got {list(self.percentiles)!r}")
        for key, limit in self.goodput:
            if not isinstance(key, Slo) or not math.isfinite(limit) or limit <= 0:
                raise UsageError(f"goodput objective {key}:{limit} must be ttft, tpot or e2e with ms > 0")
        if not isinstance(self.extra_body, dict):
            raise UsageError("extra body must be a JSON object")
        for name, value in self.headers:
            if not name or any(c in name + value for c in "\r\n\0") or ":" in name \
                    or len(name) + len(value) > MAX_HEADER_CHARS:
                raise UsageError(f"invalid header {name!r}: expected NAME:VALUE on one line")
        if self.api_key is not None and (not self.api_key or any(c in self.api_key for c in "\r\n\0")):
            raise UsageError("API key must be one non-empty line")
        _check_int("max connection failures", self.max_connection_failures, 1, MAX_REQUESTS)

    @property
    def peak_concurrency(self) -> int:
        """The most requests this plan can have in flight at once (sockets it needs)."""
        if self.request_rate is None:
            return max(self.concurrency)
        if self.max_concurrency:
            return self.max_concurrency
        return min(self.requests or 1024, 1024) if math.isinf(self.request_rate) else 1024

    def request_headers(self) -> dict[str, str]:
        """``--header`` values, then the API key as vLLM and SGLang send it."""
        headers = dict(self.headers)
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["concurrency"] = list(self.concurrency)
        doc["percentiles"] = list(self.percentiles)
        doc["goodput"] = {k.value: v for k, v in self.goodput}
        doc["headers"] = sorted(name for name, _ in self.headers)  # names only: values may be secrets
        doc["api_key"] = bool(self.api_key)  # never the key itself
        if self.request_rate is not None and math.isinf(self.request_rate):
            doc["request_rate"] = "inf"
        return doc


def _check_int(name: str, value: object, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise UsageError(f"{name} must be a whole number within {lo}..{hi}, got {value!r}")


def _check_float(name: str, value: object, hi: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 < value <= hi:
        raise UsageError(f"{name} must be a number of seconds within (0, {hi:g}], got {value!r}")


def parse_levels(text: str) -> tuple[int, ...]:
    """``"1,2,4"`` -> ``(1, 2, 4)``; UsageError naming the bad item."""
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not t for t in items):
        raise UsageError(f"invalid concurrency list {text!r}: expected e.g. 1,2,4,8")
    levels = []
    for t in items:
        if not t.isdigit():
            raise UsageError(f"invalid concurrency {t!r}: expected a whole number >= 1")
        value = int(t)
        if not 1 <= value <= MAX_CONCURRENCY:
            raise UsageError(f"invalid concurrency {t}: must be within 1..{MAX_CONCURRENCY}")
        levels.append(value)
    return tuple(levels)


def normalize_url(url: str) -> str:
    """The server's base URL (``http://host:port``); a trailing ``/v1`` is accepted and dropped."""
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018 - raises ValueError on a malformed or out-of-range port
    except ValueError as exc:
        raise UsageError(f"invalid URL {url!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"invalid URL {url!r}: expected http://HOST:PORT")
    if parts.query or parts.fragment:
        raise UsageError(f"invalid URL {url!r}: no query or fragment expected")
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return f"{parts.scheme}://{parts.netloc}{path}"


@dataclass(frozen=True)
class Progress:
    """Where a run stands; passed to ``on_progress`` at each level start and request end."""

    level_index: int
    levels: int
    concurrency: int | None
    done: int
    total: int | None
    elapsed_s: float
    warmup: bool = False
    finished: bool = False  # the level (or its warm-up) is over


@dataclass
class BenchResult:
    """A whole run; ``to_json()`` is the ``gpuslate.bench.v1`` document."""

    url: str
    model: str | None  # None: interrupted before the server named it
    api: str
    started_at: str
    plan: LoadPlan
    server: dict[str, Any] = field(default_factory=dict)
    levels: list[LevelResult] = field(default_factory=list)
    interrupted: bool = False
    in_flight: list[dict[str, Any]] = field(default_factory=list)  # abandoned by an interrupt
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every level ran to its end and no request failed."""
        return not self.interrupted and bool(self.levels) and all(
            lv.failed == 0 and lv.completed > 0 for lv in self.levels)

    def to_json(self) -> dict[str, Any]:
        return {"schema": "gpuslate.bench.v1", "gpuslate_version": __version__, "url": self.url,
                "model": self.model, "api": self.api, "started_at": self.started_at,
                "plan": self.plan.to_json(), "server": self.server, "ok": self.ok,
                "interrupted": self.interrupted, "in_flight": list(self.in_flight),
                "warnings": list(self.warnings), "levels": [lv.to_json() for lv in self.levels]}


# -- a run -------------------------------------------------------------------------------


def _ensure_fd_limit(needed: int) -> None:
    """Raise the soft open-files limit if the plan needs more sockets than it allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needed + 64
    if soft != resource.RLIM_INFINITY and soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            raise UsageError(f"{needed} concurrent requests need {want} open files; the limit is "
                             f"{hard} (ulimit -n)")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


@dataclass
class _Level:
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


class _Run:
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
                          duration_s: float | None, warmup: bool = False) -> _Level:
        level = _Level([])
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

    async def arrivals(self, index: int) -> _Level:
        """Requests at ``request_rate``: gamma-distributed gaps of shape ``burstiness`` (1:
        Poisson), the mean gap 1 / rate, as vLLM's ``get_request``; inf: all at once."""
        plan = self.plan
        assert plan.request_rate is not None
        rate, shape = plan.request_rate, plan.burstiness
        rng = random.Random(plan.seed)
        limit = asyncio.Semaphore(plan.max_concurrency) if plan.max_concurrency else None
        level = _Level([])
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

    async def warm(self, index: int, concurrency: int) -> _Level:
        return await self.closed_loop(index, min(concurrency, self.plan.warmup), self.plan.warmup, None,
                                      warmup=True)


async def _unless_stopped(stop: asyncio.Event | None, coro: Awaitable[_T]) -> tuple[_T | None, bool]:
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
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
    async with aiohttp.ClientSession(connector=connector, read_bufsize=1 << 20) as session:
        result = BenchResult(base, plan.model, plan.api, started_at, plan)
        model, cut = await _unless_stopped(stop, resolve_model(session, base, plan.model, headers))
        if cut:
            result.interrupted = True
            return result
        result.model = model
        server, cut = await _unless_stopped(stop, server_facts(session, base, headers))
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
        run = _Run(client, plan, prompts, on_progress, stop)
        levels: list[int | None] = [None] if plan.request_rate is not None else list(plan.concurrency)
        for index, concurrency in enumerate(levels):
            if plan.warmup and (plan.warmup_each_level or index == 0):
                width = concurrency if concurrency is not None else (plan.max_concurrency or plan.warmup)
                warm = await run.warm(index, width)
                if warm.cut:
                    result.interrupted = True
                    result.in_flight = [{"level": index, "warmup": True, **r} for r in warm.in_flight]
                    break
            before, cut = await _unless_stopped(stop, spec_counters(session, base, result.server, headers))
            if cut:
                result.interrupted = True
                break
            lv = await (run.arrivals(index) if concurrency is None
                        else run.closed_loop(index, concurrency, plan.requests, plan.duration_s))
            after = None
            if not lv.cut:
                after, _ = await _unless_stopped(stop, spec_counters(session, base, result.server, headers))
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
    """:func:`run_bench_async` in a fresh event loop."""
    return asyncio.run(run_bench_async(url, plan, on_progress=on_progress))
