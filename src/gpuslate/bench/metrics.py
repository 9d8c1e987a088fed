"""Per-request records and per-level figures of ``gpuslate bench`` (pure: no I/O, no clock).

The definitions are those of SGLang's ``python/sglang/bench_serving.py``
(``calculate_metrics``) and vLLM's ``vllm/benchmarks/serve.py``
(``calculate_metrics``), so figures can be compared with theirs one to one;
``docs/bench.md`` cites them field by field:

* TTFT: request sent -> first streamed chunk that carries generated text.
* ITL: the gaps between consecutive text-carrying chunks (every gap of every
  request is one sample, as both tools pool them).
* TPOT: ``(e2e - ttft) / (output_tokens - 1)`` per request, only for requests
  with more than one output token.
* E2E: request sent -> last byte of the response.
* Throughputs divide by the level's duration: first request sent -> last
  request finished.
* Achieved concurrency: sum of the successful requests' latencies / duration
  (SGLang's ``concurrency``).
* Percentiles interpolate linearly between closest ranks (``numpy.percentile``'s
  default, which both tools call).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

PERCENTILES: tuple[int, ...] = (50, 90, 99)


@dataclass
class RequestRecord:
    """What one request did, in seconds relative to its own start."""

    ok: bool = False
    error: str | None = None
    start: float = 0.0  # monotonic time the request was sent
    ttft: float | None = None
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0
    tokens_estimated: bool = False  # the server reported no usage: chunks were counted

    @property
    def end(self) -> float:
        return self.start + self.latency


@dataclass(frozen=True)
class Summary:
    """Mean and percentiles of one latency figure, in milliseconds (None: no samples)."""

    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None

    def to_json(self) -> dict[str, float | None]:
        return {k: None if v is None else round(v, 4) for k, v in
                (("mean", self.mean), ("p50", self.p50), ("p90", self.p90), ("p99", self.p99))}


def percentile(values: Sequence[float], q: float) -> float:
    """``numpy.percentile(values, q)`` with its default linear interpolation."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within 0..100, got {q}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(ordered) - 1)
    frac = rank - lo
    return ordered[lo] + (ordered[hi] - ordered[lo]) * frac


def summarize(seconds: Sequence[float]) -> Summary:
    """Mean/p50/p90/p99 in milliseconds of values given in seconds."""
    if not seconds:
        return Summary(None, None, None, None)
    ms = [s * 1000.0 for s in seconds]
    return Summary(math.fsum(ms) / len(ms), *(percentile(ms, q) for q in PERCENTILES))


def tpot(latency: float, ttft: float | None, output_tokens: int) -> float | None:
    """Time per output token after the first; None when it is undefined (0 or 1 tokens)."""
    if ttft is None or output_tokens <= 1:
        return None
    return (latency - ttft) / (output_tokens - 1)


def error_groups(records: Sequence[RequestRecord]) -> dict[str, int]:
    """Failed requests grouped by message, most frequent first."""
    counts = Counter(r.error or "unknown error" for r in records if not r.ok)
    return dict(counts.most_common())


@dataclass
class LevelResult:
    """The figures of one load level; ``to_json()`` is one element of ``levels[]``."""

    concurrency: int | None
    request_rate: float | None
    completed: int
    failed: int
    errors: dict[str, int]
    duration_s: float
    request_throughput: float
    output_token_throughput: float
    total_token_throughput: float
    ttft_ms: Summary
    tpot_ms: Summary
    itl_ms: Summary
    e2e_ms: Summary
    achieved_concurrency: float
    accept_length: float | None
    tokens_estimated: bool
    input_tokens: int
    output_tokens: int
    max_concurrency: int | None = None
    interrupted: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency, "request_rate": self.request_rate,
            "max_concurrency": self.max_concurrency,
            "completed": self.completed, "failed": self.failed, "errors": dict(self.errors),
            "duration_s": round(self.duration_s, 6),
            "request_throughput": round(self.request_throughput, 4),
            "output_token_throughput": round(self.output_token_throughput, 4),
            "total_token_throughput": round(self.total_token_throughput, 4),
            "ttft_ms": self.ttft_ms.to_json(), "tpot_ms": self.tpot_ms.to_json(),
            "itl_ms": self.itl_ms.to_json(), "e2e_ms": self.e2e_ms.to_json(),
            "achieved_concurrency": round(self.achieved_concurrency, 4),
            "accept_length": None if self.accept_length is None else round(self.accept_length, 4),
            "tokens_estimated": self.tokens_estimated,
            "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
            "interrupted": self.interrupted,
        }


def level_result(records: Sequence[RequestRecord], *, concurrency: int | None,
                 request_rate: float | None, max_concurrency: int | None = None,
                 accept_length: float | None = None, duration_s: float | None = None,
                 interrupted: bool = False) -> LevelResult:
    """The level's figures from its requests (warm-up requests are not passed in).

    ``duration_s`` defaults to first start -> last end, as both reference tools
    measure the benchmark from its first request to its last completion.
    """
    done = [r for r in records if r.ok]
    if duration_s is None:
        duration_s = (max(r.end for r in records) - min(r.start for r in records)) if records else 0.0
    inp = sum(r.prompt_tokens for r in done)
    out = sum(r.output_tokens for r in done)

    def per_s(x: float) -> float:
        return x / duration_s if duration_s > 0 else 0.0

    tpots = [t for r in done if (t := tpot(r.latency, r.ttft, r.output_tokens)) is not None]
    return LevelResult(
        concurrency=concurrency, request_rate=request_rate, max_concurrency=max_concurrency,
        completed=len(done), failed=len(records) - len(done), errors=error_groups(records),
        duration_s=duration_s,
        request_throughput=per_s(len(done)), output_token_throughput=per_s(out),
        total_token_throughput=per_s(inp + out),
        ttft_ms=summarize([r.ttft for r in done if r.ttft is not None]),
        tpot_ms=summarize(tpots),
        itl_ms=summarize([gap for r in done for gap in r.itl]),
        e2e_ms=summarize([r.latency for r in done]),
        achieved_concurrency=per_s(math.fsum(r.latency for r in done)),
        accept_length=accept_length,
        tokens_estimated=any(r.tokens_estimated for r in done),
        input_tokens=inp, output_tokens=out, interrupted=interrupted,
    )
