"""The load generator of ``gpuslate bench``: an asyncio/aiohttp client for
OpenAI-compatible servers (SGLang, vLLM, ``gpuslate sim serve``, ...).

A *plan* is a list of closed-loop concurrency levels, run one after another
(each level keeps ``c`` requests in flight until it has sent its requests or
its time is up), or a Poisson arrival process at ``request_rate`` requests/s
optionally capped at ``max_concurrency`` in flight. Figures come from
:mod:`gpuslate.bench.metrics`; token counts from the server's ``usage``
(streams ask for it with ``stream_options.include_usage``), else from the
streamed chunks, and then the level says ``tokens_estimated``.

Nothing is printed here; progress goes to a callback and errors are raised
as :class:`~gpuslate.errors.GpuslateError` subclasses, a bad plan before
anything is sent.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import resource
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Literal
from urllib.parse import urlsplit

import aiohttp

from .. import __version__
from .._time import iso_time
from ..errors import ServerFailed, UsageError
from .metrics import LevelResult, RequestRecord, level_result
from .prompts import Prompt, PromptSource, load_dataset

Api = Literal["completions", "chat"]
APIS: tuple[str, ...] = ("completions", "chat")

# Bounds that keep a typo from becoming a runaway run (or a socket storm).
MAX_CONCURRENCY = 10_000
MAX_REQUESTS = 10_000_000
MAX_LEN = 1_000_000
MAX_DURATION_S = 7 * 24 * 3600.0
MAX_RATE = 1_000_000.0
PROBE_TIMEOUT_S = 10.0  # model list and server-info look-ups
_ERROR_CHARS = 200  # an error message is cut to this before it is grouped
_decode = json.JSONDecoder().decode  # str in: json.loads would sniff each bytes chunk's encoding


@dataclass(frozen=True)
class LoadPlan:
    """What to send; see docs/bench.md. Validated by :meth:`validate` before anything is sent."""

    concurrency: tuple[int, ...] = (1,)  # closed-loop levels, one after another
    request_rate: float | None = None  # Poisson arrivals instead (then concurrency is ignored)
    max_concurrency: int | None = None
    requests: int | None = 64  # per level (None with duration_s)
    duration_s: float | None = None
    warmup: int = 0
    seed: int = 0
    api: Api = "completions"
    stream: bool = True
    input_len: int = 128
    output_len: int = 128
    dataset: str | None = None
    model: str | None = None  # None: ask GET /v1/models and use the first
    ignore_eos: bool = True
    timeout_s: float = 600.0  # per request

    def validate(self) -> None:
        """Raise :class:`UsageError` (one line) on the first bad value."""
        if self.request_rate is None:
            if not self.concurrency:
                raise UsageError("no concurrency levels given")
            for c in self.concurrency:
                _check_int("concurrency", c, 1, MAX_CONCURRENCY)
        else:
            if isinstance(self.request_rate, bool) or not isinstance(self.request_rate, (int, float)) \
                    or not math.isfinite(self.request_rate) or not 0 < self.request_rate <= MAX_RATE:
                raise UsageError(f"request rate must be a number within (0, {MAX_RATE:g}], "
                                 f"got {self.request_rate!r}")
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

    @property
    def peak_concurrency(self) -> int:
        """The most requests this plan can have in flight at once (sockets it needs)."""
        if self.request_rate is None:
            return max(self.concurrency)
        return self.max_concurrency or 1024

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["concurrency"] = list(self.concurrency)
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


@dataclass
class BenchResult:
    """A whole run; ``to_json()`` is the ``gpuslate.bench.v1`` document."""

    url: str
    model: str
    api: str
    started_at: str
    plan: LoadPlan
    server: dict[str, Any] = field(default_factory=dict)
    levels: list[LevelResult] = field(default_factory=list)
    interrupted: bool = False

    @property
    def ok(self) -> bool:
        """Every level ran to its end and no request failed."""
        return not self.interrupted and bool(self.levels) and all(
            lv.failed == 0 and lv.completed > 0 for lv in self.levels)

    def to_json(self) -> dict[str, Any]:
        return {"schema": "gpuslate.bench.v1", "gpuslate_version": __version__, "url": self.url,
                "model": self.model, "api": self.api, "started_at": self.started_at,
                "plan": self.plan.to_json(), "server": self.server, "ok": self.ok,
                "interrupted": self.interrupted, "levels": [lv.to_json() for lv in self.levels]}


# -- one request --------------------------------------------------------------


def _short(message: str) -> str:
    line = " ".join(message.split())
    return line if len(line) <= _ERROR_CHARS else line[: _ERROR_CHARS - 1] + "…"


def _error_message(body: bytes) -> str:
    """The ``error.message`` of an OpenAI-shaped error body, else the body's text."""
    try:
        doc = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace")
    if isinstance(doc, dict):
        err = doc.get("error", doc)
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"]
        if isinstance(err, str):
            return err
        if isinstance(doc.get("detail"), str):  # FastAPI's shape
            return doc["detail"]
    return body.decode("utf-8", "replace")


def _chunk_text(obj: dict[str, Any]) -> str:
    choices = obj.get("choices")
    if not choices:
        return ""
    choice = choices[0]
    if "text" in choice:
        return choice["text"] or ""
    delta = choice.get("delta") or choice.get("message") or {}
    # Reasoning models stream their thinking first: it is generated text too.
    return delta.get("content") or delta.get("reasoning_content") or ""


class _Client:
    """Sends one request and records it, the way the reference tools time it."""

    def __init__(self, session: aiohttp.ClientSession, base: str, plan: LoadPlan, model: str) -> None:
        self.session = session
        self.plan = plan
        self.model = model
        path = "/v1/completions" if plan.api == "completions" else "/v1/chat/completions"
        self.url = base + path
        self.timeout = aiohttp.ClientTimeout(total=plan.timeout_s)

    def body(self, prompt: Prompt) -> dict[str, Any]:
        p = self.plan
        body: dict[str, Any] = {"model": self.model, "temperature": 0.0, "stream": p.stream}
        if p.api == "completions":
            body["prompt"] = prompt.text
            body["max_tokens"] = prompt.output_len
        else:
            body["messages"] = [{"role": "user", "content": prompt.text}]
            body["max_completion_tokens"] = prompt.output_len
        if p.stream:
            body["stream_options"] = {"include_usage": True}
        if p.ignore_eos:
            body["ignore_eos"] = True
        return body

    async def send(self, prompt: Prompt) -> RequestRecord:
        rec = RequestRecord()
        payload = json.dumps(self.body(prompt)).encode()
        rec.start = st = time.perf_counter()
        try:
            async with self.session.post(self.url, data=payload, timeout=self.timeout,
                                         headers={"Content-Type": "application/json"}) as resp:
                if resp.status != 200:
                    rec.error = _short(f"HTTP {resp.status}: {_error_message(await resp.content.read(65536))}")
                elif self.plan.stream:
                    await self._read_stream(resp, rec, prompt, st)
                else:
                    await self._read_whole(resp, rec, prompt, st)
        except asyncio.TimeoutError:
            rec.error = f"timeout after {self.plan.timeout_s:g} s"
        except aiohttp.ClientConnectorError as exc:
            rec.error = _short(f"cannot connect: {_connect_failure(exc)}")
        except aiohttp.ServerDisconnectedError:
            rec.error = "server disconnected"
        except aiohttp.ClientPayloadError as exc:
            rec.error = _short(f"response cut short: {exc}")
        except aiohttp.ClientError as exc:
            rec.error = _short(f"{type(exc).__name__}: {exc}")
        except ValueError as exc:  # malformed JSON in a response
            rec.error = _short(f"malformed response: {exc}")
        rec.latency = time.perf_counter() - st
        rec.ok = rec.error is None
        return rec

    async def _read_stream(self, resp: aiohttp.ClientResponse, rec: RequestRecord,
                           prompt: Prompt, st: float) -> None:
        """Parse the server-sent events as they arrive.

        Reading whole network buffers (not line by line) halves the client's CPU per
        token; every event of one buffer is stamped with the buffer's arrival time,
        which is when a line-by-line reader would have seen it too (give or take
        the microseconds it spends parsing the events before it).
        """
        last = st
        chunks = 0
        usage: dict[str, Any] | None = None
        finished = done = False
        pending = b""
        async for data in resp.content.iter_any():
            now = time.perf_counter()
            lines = (pending + data).split(b"\n")
            pending = lines.pop()  # an incomplete last line waits for the next buffer
            for line in lines:
                if not line.startswith(b"data:"):
                    continue  # blank separators, comments, event: lines
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    finished = done = True
                    break
                obj = _decode(payload.decode())
                if not isinstance(obj, dict):
                    continue
                if "error" in obj and "choices" not in obj:
                    rec.error = _short(f"error in stream: {_error_message(payload)}")
                    return
                choices = obj.get("choices")
                if choices:
                    if _chunk_text(obj):
                        if rec.ttft is None:
                            rec.ttft = now - st
                        else:
                            rec.itl.append(now - last)
                        last = now
                        chunks += 1
                    if choices[0].get("finish_reason"):
                        finished = True
                if obj.get("usage"):
                    usage = obj["usage"]
            if done:
                break
        if not finished:
            rec.error = "stream ended before [DONE]"
            return
        self._count(rec, prompt, usage, chunks)

    async def _read_whole(self, resp: aiohttp.ClientResponse, rec: RequestRecord,
                          prompt: Prompt, st: float) -> None:
        obj = json.loads(await resp.read())
        rec.ttft = time.perf_counter() - st  # no stream: the first token arrives with the last
        text = _chunk_text(obj) if isinstance(obj, dict) else ""
        usage = obj.get("usage") if isinstance(obj, dict) else None
        self._count(rec, prompt, usage, math.ceil(len(text) / 4) if text else 0)

    @staticmethod
    def _count(rec: RequestRecord, prompt: Prompt, usage: Any, estimate: int) -> None:
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            rec.output_tokens = usage["completion_tokens"]
            rec.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            return
        rec.tokens_estimated = True
        rec.output_tokens = estimate
        rec.prompt_tokens = prompt.input_len or math.ceil(len(prompt.text) / 4)


# -- server facts ------------------------------------------------------------------


async def _get_json(session: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)) as resp:
        body = await resp.read()
        try:
            return resp.status, json.loads(body) if body else None
        except ValueError:
            return resp.status, None


async def _resolve_model(session: aiohttp.ClientSession, base: str, model: str | None) -> str:
    """Check that the server answers (one clear error if not) and pick the model."""
    try:
        status, doc = await _get_json(session, base + "/v1/models")
    except (aiohttp.ClientConnectorError, asyncio.TimeoutError, aiohttp.ServerDisconnectedError) as exc:
        why = _connect_failure(exc) if isinstance(exc, aiohttp.ClientConnectorError) else (
            "no answer within {:g} s".format(PROBE_TIMEOUT_S) if isinstance(exc, asyncio.TimeoutError)
            else "disconnected")
        raise ServerFailed(f"cannot reach the server at {base}: {why}",
                           hint="is it running? (a test server: gpuslate sim serve --port 0)") from None
    except aiohttp.ClientError as exc:
        raise ServerFailed(f"cannot reach the server at {base}: {exc}") from None
    if status == 503:
        raise ServerFailed(f"the server at {base} is not ready yet (503)",
                           hint="wait for it, e.g. with gpuslate up's readiness check")
    if model is not None:
        return model
    data = doc.get("data") if isinstance(doc, dict) else None
    if status != 200 or not isinstance(data, list) or not data or not isinstance(data[0], dict) \
            or not isinstance(data[0].get("id"), str):
        raise ServerFailed(f"the server at {base} lists no model on GET /v1/models (HTTP {status})",
                           hint="name one with --model")
    return data[0]["id"]


def _connect_failure(exc: aiohttp.ClientConnectorError) -> str:
    if isinstance(exc.os_error, ConnectionRefusedError):
        return "connection refused"
    return exc.os_error.strerror or str(exc.os_error) or type(exc.os_error).__name__


async def _server_facts(session: aiohttp.ClientSession, base: str) -> dict[str, Any]:
    """Engine and version where the server reports them (SGLang, vLLM, the simulator)."""
    for path in ("/get_server_info", "/server_info"):
        try:
            status, doc = await _get_json(session, base + path)
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return {}
        if status == 200 and isinstance(doc, dict):
            engine = "gpuslate-sim" if doc.get("simulated") else "sglang"
            facts = {"engine": engine, "version": doc.get("version") if engine == "sglang" else __version__,
                     "info_path": path}
            for key in ("speculative_algorithm", "mode", "spec_disable_threshold", "time_scale"):
                if key in doc:
                    facts[key] = doc[key]
            return facts
    try:
        status, doc = await _get_json(session, base + "/version")
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return {}
    if status == 200 and isinstance(doc, dict) and isinstance(doc.get("version"), str):
        return {"engine": "vllm", "version": doc["version"]}
    return {}


@dataclass(frozen=True)
class _SpecCounters:
    tokens: float  # tokens produced by verified speculative steps (or accepted drafts + 1 per draft)
    steps: float  # request-steps (verifications) they came from
    cumulative: float | None  # the server's own running mean, when that is all there is


async def _spec_counters(session: aiohttp.ClientSession, base: str,
                         server: dict[str, Any]) -> _SpecCounters | None:
    """The server's speculative-decoding counters, read between levels."""
    try:
        if server.get("engine") in ("sglang", "gpuslate-sim"):
            status, doc = await _get_json(session, base + server.get("info_path", "/get_server_info"))
            if status != 200 or not isinstance(doc, dict):
                return None
            counters = doc.get("counters") or {}
            if "spec_tokens" in counters and "spec_request_steps" in counters:
                return _SpecCounters(counters["spec_tokens"], counters["spec_request_steps"], None)
            states = doc.get("internal_states") or [{}]
            mean = states[0].get("avg_spec_accept_length") if isinstance(states[0], dict) else None
            return _SpecCounters(0, 0, float(mean)) if isinstance(mean, (int, float)) and mean else None
        if server.get("engine") == "vllm":
            async with session.get(base + "/metrics",
                                   timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)) as resp:
                if resp.status != 200:
                    return None
                text = await resp.text()
            accepted = _prom_sum(text, "vllm:spec_decode_num_accepted_tokens_total")
            drafts = _prom_sum(text, "vllm:spec_decode_num_drafts_total")
            if accepted is None or drafts is None:
                return None
            # vLLM's mean acceptance length counts the bonus token: 1 + accepted / drafts.
            return _SpecCounters(accepted + drafts, drafts, None)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return None
    return None


def _prom_sum(text: str, name: str) -> float | None:
    """Sum of a Prometheus counter over its label sets; None if absent."""
    total = None
    for line in text.splitlines():
        if line.startswith(name) and (len(line) == len(name) or line[len(name)] in " {"):
            try:
                total = (total or 0.0) + float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
    return total


def accept_length_between(before: _SpecCounters | None, after: _SpecCounters | None) -> float | None:
    """Mean accepted tokens per verification during one level; None if the server has no such
    counters or ran no speculative step in it."""
    if after is None:
        return None
    if after.cumulative is not None:
        return after.cumulative
    steps = after.steps - (before.steps if before else 0)
    tokens = after.tokens - (before.tokens if before else 0)
    return tokens / steps if steps > 0 else None


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


class _Run:
    def __init__(self, client: _Client, plan: LoadPlan, prompts: PromptSource,
                 on_progress: Callable[[Progress], None] | None, stop: asyncio.Event | None) -> None:
        self.client = client
        self.plan = plan
        self.prompts = prompts
        self.on_progress = on_progress
        self.stop = stop
        self.levels = 1 if plan.request_rate is not None else len(plan.concurrency)

    def _report(self, index: int, concurrency: int | None, done: int, total: int | None,
                t0: float, warmup: bool = False) -> None:
        if self.on_progress is not None:
            self.on_progress(Progress(index, self.levels, concurrency, done, total,
                                      time.perf_counter() - t0, warmup))

    async def _until_stopped(self, work: list[asyncio.Task[None]]) -> bool:
        """Wait for ``work``; True if the stop event cut it short (the rest is cancelled)."""
        if not work:
            return False
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
            return False
        for task in work:
            task.cancel()
        await asyncio.gather(*work, return_exceptions=True)
        return True

    async def closed_loop(self, index: int, concurrency: int, requests: int | None,
                          duration_s: float | None, warmup: bool = False) -> tuple[list[RequestRecord], bool]:
        records: list[RequestRecord] = []
        issued = 0
        t0 = time.perf_counter()
        stop_at = None if duration_s is None else t0 + duration_s
        self._report(index, concurrency, 0, requests, t0, warmup)

        async def worker() -> None:
            nonlocal issued
            while (requests is None or issued < requests) and \
                    (stop_at is None or time.perf_counter() < stop_at):
                issued += 1
                records.append(await self.client.send(self.prompts.take()))
                self._report(index, concurrency, len(records), requests, t0, warmup)

        work = [asyncio.ensure_future(worker()) for _ in range(concurrency)]
        return records, await self._until_stopped(work)

    async def poisson(self, index: int) -> tuple[list[RequestRecord], bool]:
        plan = self.plan
        assert plan.request_rate is not None
        rng = random.Random(plan.seed)
        limit = asyncio.Semaphore(plan.max_concurrency) if plan.max_concurrency else None
        records: list[RequestRecord] = []
        t0 = time.perf_counter()
        stop_at = None if plan.duration_s is None else t0 + plan.duration_s
        self._report(index, None, 0, plan.requests, t0)

        async def one(prompt: Prompt) -> None:
            if limit is None:
                records.append(await self.client.send(prompt))
            else:
                async with limit:  # vLLM's max_concurrency: the arrival waits for a slot
                    records.append(await self.client.send(prompt))
            self._report(index, None, len(records), plan.requests, t0)

        async def arrivals() -> None:
            sent: list[asyncio.Task[None]] = []
            next_at = t0
            while plan.requests is None or len(sent) < plan.requests:
                delay = next_at - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                if stop_at is not None and time.perf_counter() >= stop_at:
                    break
                sent.append(asyncio.ensure_future(one(self.prompts.take())))
                next_at += rng.expovariate(plan.request_rate)
            try:
                await asyncio.gather(*sent)
            finally:
                for task in sent:
                    task.cancel()

        return records, await self._until_stopped([asyncio.ensure_future(arrivals())])


async def run_bench_async(url: str, plan: LoadPlan, *,
                          on_progress: Callable[[Progress], None] | None = None,
                          stop: asyncio.Event | None = None) -> BenchResult:
    """Run ``plan`` against the server at ``url``.

    ``stop``, when set, ends the run early: requests in flight are abandoned,
    finished ones are kept, and the result says ``interrupted`` (this is how
    the CLI turns Ctrl-C into partial results).
    """
    plan.validate()
    base = normalize_url(url)
    dataset = load_dataset(plan.dataset, plan.output_len) if plan.dataset else None
    _ensure_fd_limit(plan.peak_concurrency)
    started_at = iso_time(time.time())
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
    async with aiohttp.ClientSession(connector=connector, read_bufsize=1 << 20) as session:
        model = await _resolve_model(session, base, plan.model)
        server = await _server_facts(session, base)
        result = BenchResult(base, model, plan.api, started_at, plan, server)
        prompts = PromptSource(input_len=plan.input_len, output_len=plan.output_len,
                               seed=plan.seed, dataset=dataset)
        run = _Run(_Client(session, base, plan, model), plan, prompts, on_progress, stop)
        if plan.warmup:
            first = plan.concurrency[0] if plan.request_rate is None else (plan.max_concurrency or plan.warmup)
            _, cut = await run.closed_loop(0, min(first, plan.warmup), plan.warmup, None, warmup=True)
            if cut:
                result.interrupted = True
                return result
        levels: list[int | None] = [None] if plan.request_rate is not None else list(plan.concurrency)
        for index, concurrency in enumerate(levels):
            before = await _spec_counters(session, base, server)
            if concurrency is None:
                records, cut = await run.poisson(index)
            else:
                records, cut = await run.closed_loop(index, concurrency, plan.requests, plan.duration_s)
            after = await _spec_counters(session, base, server) if not cut else None
            if records or not cut:
                result.levels.append(level_result(
                    records, concurrency=concurrency, request_rate=plan.request_rate,
                    max_concurrency=plan.max_concurrency, interrupted=cut,
                    accept_length=accept_length_between(before, after)))
            if cut:
                result.interrupted = True
                break
        return result


def run_bench(url: str, plan: LoadPlan, *,
              on_progress: Callable[[Progress], None] | None = None) -> BenchResult:
    """:func:`run_bench_async` in a fresh event loop."""
    return asyncio.run(run_bench_async(url, plan, on_progress=on_progress))
