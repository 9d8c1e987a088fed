"""What ``gpuslate bench`` sends: the load plan, checked before anything is sent.

A *plan* is a list of closed-loop concurrency levels, run one after another
(each level keeps ``c`` requests in flight until it has sent its requests or
its time is up), or an arrival process at ``request_rate`` requests/s
(Poisson, or gamma with ``burstiness``; ``inf``: all at once, vLLM's rule)
optionally capped at ``max_concurrency`` in flight. Each level is preceded by
``warmup`` requests at its own concurrency (a continuous-batching server is
slow the first time it sees a batch size), left out of the figures.

Pure data and validation, no I/O and no aiohttp: an experiment spec builds
plans and a report reads them without the ``bench`` extra installed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal
from urllib.parse import urlsplit

from ..errors import UsageError
from .metrics import DEFAULT_PERCENTILES, Slo

Api = Literal["completions", "chat"]
APIS: tuple[str, ...] = ("completions", "chat")
#: how requests reach the server, and so what TTFT and E2E contain: ``pooled`` keeps connections open and
#: reuses them (vLLM's ``bench serve``, and the OpenAI SDKs, which share one keep-alive pool); ``per-request``
#: opens a new one for every request inside its clock and closes it after (SGLang's ``bench_serving``,
#: which makes an ``aiohttp.ClientSession`` per request): its set-up then counts in TTFT and E2E
Connection = Literal["pooled", "per-request"]
CONNECTIONS: tuple[str, ...] = ("pooled", "per-request")

# Bounds that keep a typo from becoming a runaway run (or a socket storm).
MAX_CONCURRENCY = 10_000
MAX_REQUESTS = 10_000_000
MAX_LEN = 1_000_000
MAX_DURATION_S = 7 * 24 * 3600.0
MAX_RATE = 1_000_000.0
MAX_BURSTINESS = 1000.0
MAX_HEADER_CHARS = 8192
#: a header value or API key read back from a document (which never carries them)
REDACTED = "(redacted)"


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
    connection: Connection = "pooled"  # see CONNECTIONS: what a request's clock includes

    def validate(self) -> None:
        """Raise :class:`UsageError` (one line) on the first bad value."""
        if self.request_rate is None:
            if not self.concurrency:
                raise UsageError("no concurrency levels given")
            for c in self.concurrency:
                _check_int("concurrency", c, 1, MAX_CONCURRENCY)
        else:
            if isinstance(self.request_rate, bool) or not isinstance(self.request_rate, (int, float)) \
                    or math.isnan(self.request_rate) or not self.request_rate > 0 \
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
        if self.connection not in CONNECTIONS:
            raise UsageError(f"connection must be one of {', '.join(CONNECTIONS)}, got {self.connection!r}")

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

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LoadPlan:
        """The plan a document describes, as far as it does: header values and the API key are never
        in it (names only, and whether a key was sent), so they come back as :data:`REDACTED`.
        Malformed: ValueError or TypeError (read inside :func:`gpuslate._document.reading`)."""
        if not isinstance(d, dict):
            raise TypeError(f"plan: expected an object, got {d!r}")
        known = {f.name for f in fields(cls)}
        # a field a document lacks takes its default: a document from before ``connection`` was pooled
        values = {k: v for k, v in d.items() if k in known}
        rate = values.get("request_rate")
        values.update(
            concurrency=tuple(d["concurrency"]), percentiles=tuple(d["percentiles"]),
            goodput=tuple((Slo(k), v) for k, v in d["goodput"].items()),
            headers=tuple((str(name), REDACTED) for name in d["headers"]),
            api_key=REDACTED if d["api_key"] else None,
            request_rate=math.inf if rate == "inf" else rate)
        if not isinstance(values.get("extra_body", {}), dict):
            raise TypeError("extra_body: expected an object")
        return cls(**values)


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
    path = path.removesuffix("/v1")
    return f"{parts.scheme}://{parts.netloc}{path}"
