"""Per-request records and per-level figures of ``gpuslate bench`` (pure: no I/O, no clock).

Every figure is named for what it measures, and each follows a reference tool
line by line (``docs/bench.md`` cites the file and line of each):

* ``ttft_ms``: request sent -> first streamed chunk that carries generated
  text (SGLang's ``bench_serving`` rule). ``ttft_vllm_ms`` beside it: request
  sent -> first chunk with any ``choices`` (vLLM's ``bench serve``), which for
  chat includes the role-only first chunk.
* ``itl_ms``: inter-token latency *per token*, as SGLang's default backend
  computes it: after the first text chunk, each chunk's gap to the previous
  text chunk is divided by the tokens it carries and counted once per token.
  With one token per chunk it equals the chunk gap; with speculative decoding
  (several tokens a chunk) it does not.
* ``chunk_gap_ms``: the gaps between consecutive text-carrying chunks (what
  SGLang's OpenAI backend and vLLM call ITL).
* ``tpot_ms``: ``(e2e - ttft) / (output_tokens - 1)`` per request with more
  than one output token.
* ``e2e_ms``: request sent -> last byte of the response.
* Throughputs divide by the level's duration (first request sent -> last
  request finished); ``peak_output_token_throughput`` is vLLM's "peak output
  tokens per second": the most tokens that arrived within one second, over
  equal windows of at least a second that tile the level from its first request
  (vLLM's whole-second buckets end in a partial one, which undercounts: see
  :func:`peak_output_throughput`).
* ``goodput``: requests per second that met every ``--goodput`` objective
  (vLLM's definition), and the share of completed requests that did.
* ``achieved_concurrency``: sum of the successful requests' latencies /
  duration (SGLang's ``concurrency``).
* Percentiles interpolate linearly between closest ranks (``numpy.percentile``'s
  default, which both tools call); ``std`` is the population deviation
  (``numpy.std``).

How many tokens each chunk carried (for ``itl_ms``) is known from the chunk's
own cumulative usage (vLLM's ``continuous_usage_stats``), else from counting
its text with ``--tokenizer``, else by splitting the request's token total
over its chunks by text length (the total itself from ``usage``, or the
tokenizer, or estimated: then the request says ``tokens_estimated``).
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from .._document import Fields

DEFAULT_PERCENTILES: tuple[float, ...] = (50, 90, 95, 99)
PEAK_BUCKET_S = 1.0  # vLLM buckets tokens per whole second


class TokenSource(str, enum.Enum):
    """Where a request's output-token count came from."""

    USAGE = "usage"  # the server's usage.completion_tokens
    TOKENIZER = "tokenizer"  # the generated text counted with --tokenizer
    ESTIMATED = "estimated"  # neither: ~4 characters a token, at least one per text chunk


class Slo(str, enum.Enum):
    """The objectives ``--goodput`` accepts (vLLM's names, e2e for its e2el)."""

    TTFT = "ttft"
    TPOT = "tpot"
    E2E = "e2e"


@dataclass
class RequestRecord:
    """What one request did, in seconds relative to its own start."""

    ok: bool = False
    error: str | None = None
    start: float = 0.0  # monotonic time the request was sent
    ttft: float | None = None  # SGLang's rule: first chunk with text
    ttft_vllm: float | None = None  # vLLM's rule: first chunk with any choices
    latency: float = 0.0
    chunk_times: list[float] = field(default_factory=list)  # arrival of each text chunk, from start
    chunk_tokens: list[int] = field(default_factory=list)  # tokens of each text chunk (same length)
    prompt_tokens: int = 0
    output_tokens: int = 0
    token_source: TokenSource = TokenSource.USAGE

    @property
    def end(self) -> float:
        return self.start + self.latency

    @property
    def tokens_estimated(self) -> bool:
        return self.token_source is TokenSource.ESTIMATED

    @property
    def chunk_gaps(self) -> list[float]:
        t = self.chunk_times
        return [b - a for a, b in pairwise(t)]

    @property
    def itl(self) -> list[float]:
        return per_token_itl(self.chunk_times, self.chunk_tokens)


def per_token_itl(times: Sequence[float], tokens: Sequence[int]) -> list[float]:
    """SGLang's per-token ITL of one request: after the first chunk, each chunk's gap
    divided by its tokens, once per token; a chunk of 0 tokens is skipped and its gap
    carried into the next (SGLang ``continue``s without moving its timestamp)."""
    out: list[float] = []
    last = None
    for t, n in zip(times, tokens):
        if last is None:
            last = t
            continue
        if n <= 0:
            continue
        out.extend([(t - last) / n] * n)
        last = t
    return out


def split_tokens(total: int, chunk_chars: Sequence[int]) -> list[int]:
    """``total`` tokens spread over chunks in proportion to their text length (largest
    remainder, at least one per chunk where the total allows): the per-chunk counts when
    the server reports only a total. Sums to ``total`` exactly."""
    n = len(chunk_chars)
    if n == 0:
        return []
    if total <= n:
        return [1] * total + [0] * (n - total)
    chars = sum(chunk_chars)
    shares = [total * (c / chars if chars > 0 else 1 / n) for c in chunk_chars]
    parts = [max(1, math.floor(x)) for x in shares]
    while sum(parts) > total:  # the floor of one token a chunk overshot: take from the most over
        i = max((i for i in range(n) if parts[i] > 1), key=lambda i: (parts[i] - shares[i], -i))
        parts[i] -= 1
    for i in sorted(range(n), key=lambda i: (parts[i] - shares[i], i))[: total - sum(parts)]:
        parts[i] += 1  # the largest remainders get the tokens left
    return parts


@dataclass(frozen=True)
class Summary:
    """Mean, median, deviation, max and percentiles of one latency figure, in milliseconds
    (None: no samples)."""

    mean: float | None
    std: float | None
    max: float | None
    percentiles: tuple[tuple[float, float], ...] = ()  # (q, value) in the order asked

    def pct(self, q: float) -> float | None:
        return next((v for p, v in self.percentiles if p == q), None)

    @property
    def p50(self) -> float | None:
        return self.pct(50)

    @property
    def p99(self) -> float | None:
        return self.pct(99)

    def to_json(self) -> dict[str, float | None]:
        doc: dict[str, float | None] = {"mean": _r(self.mean), "std": _r(self.std), "max": _r(self.max)}
        for q, v in self.percentiles:
            doc[pct_key(q)] = _r(v)
        return doc

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Summary:
        """A summary from its document (a ValueError or TypeError on a malformed one: the caller
        reads it inside :func:`gpuslate._document.reading`)."""
        pcts = tuple((_pct_of(k), _number(v)) for k, v in d.items() if k not in ("mean", "std", "max"))
        return cls(_number(d["mean"]), _number(d["std"]), _number(d["max"]), pcts)  # type: ignore[arg-type]


def pct_key(q: float) -> str:
    """``50 -> "p50"``, ``99.9 -> "p99.9"``."""
    return f"p{q:g}"


def _pct_of(key: str) -> float:
    """``"p50" -> 50.0``: the inverse of :func:`pct_key`."""
    if not key.startswith("p"):
        raise ValueError(f"not a percentile key: {key!r}")
    return float(key[1:])


def _number(v: object) -> float | None:
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
        raise TypeError(f"expected a number, got {v!r}")
    return v


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


def percentile(values: Sequence[float], q: float, *, ordered: bool = False) -> float:
    """``numpy.percentile(values, q)`` with its default linear interpolation (``ordered``: the
    values are sorted already, as :func:`summarize` sorts them once for all its percentiles)."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within 0..100, got {q}")
    if not ordered:
        values = sorted(values)
    rank = (len(values) - 1) * q / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(values) - 1)
    frac = rank - lo
    return values[lo] + (values[hi] - values[lo]) * frac


def summarize(seconds: Sequence[float], percentiles: Sequence[float] = DEFAULT_PERCENTILES) -> Summary:
    """Summary in milliseconds of values given in seconds; p50, p90 and p99 are always included
    (the v1 document promises them), the others as asked."""
    qs = tuple(dict.fromkeys([50.0, 90.0, 99.0, *(float(q) for q in percentiles)]))
    if not seconds:
        return Summary(None, None, None, tuple((q, None) for q in qs))  # type: ignore[misc]
    ms = [s * 1000.0 for s in seconds]
    ms.sort()
    mean = math.fsum(ms) / len(ms)
    std = math.sqrt(math.fsum([(x - mean) ** 2 for x in ms]) / len(ms))
    return Summary(mean, std, ms[-1], tuple((q, percentile(ms, q, ordered=True)) for q in qs))


def tpot(latency: float, ttft: float | None, output_tokens: int) -> float | None:
    """Time per output token after the first; None when it is undefined (0 or 1 tokens)."""
    if ttft is None or output_tokens <= 1:
        return None
    return (latency - ttft) / (output_tokens - 1)


def error_groups(records: Sequence[RequestRecord]) -> dict[str, int]:
    """Failed requests grouped by message, most frequent first."""
    counts = Counter(r.error or "unknown error" for r in records if not r.ok)
    return dict(counts.most_common())


def meets_slo(r: RequestRecord, slo: Mapping[Slo, float]) -> bool:
    """vLLM's goodput test: every objective given (ms) is met; an undefined TPOT meets it."""
    for key, limit_ms in slo.items():
        if key is Slo.TTFT:
            value = r.ttft
        elif key is Slo.TPOT:
            value = tpot(r.latency, r.ttft, r.output_tokens)
            if value is None:
                continue
        else:
            value = r.latency
        if value is None or value * 1000.0 > limit_ms:
            return False
    return True


def peak_output_throughput(records: Sequence[RequestRecord], t0: float, duration_s: float) -> float:
    """The most output tokens per second within one of the equal windows, each at least
    :data:`PEAK_BUCKET_S` long (the whole level when it is shorter), that tile the level from
    ``t0`` for ``duration_s``.

    vLLM counts whole-second buckets from the first request, so its last bucket is partial and
    a level shorter than a second is one partial bucket: its "peak" then falls below the mean.
    Windows that tile the level never do (the most of several rates is at least their mean), and
    for a long level they are one second within a few percent, as vLLM's."""
    if duration_s <= 0:
        return 0.0
    n = max(1, int(duration_s // PEAK_BUCKET_S))
    width = duration_s / n
    buckets = [0] * n
    last = n - 1
    for r in records:
        start = r.start
        for t, k in zip(r.chunk_times, r.chunk_tokens):
            i = int((start + t - t0) // width)
            buckets[i if 0 <= i <= last else (0 if i < 0 else last)] += k
    return max(buckets) / width


def warming_tail(records: Sequence[RequestRecord], *, factor: float = 2.0) -> bool:
    """True when the level's first requests were much slower than the rest, the mark of a
    server still warming up at this concurrency: the median latency of the first tenth
    (at least 2 requests) is over ``factor`` times the median of the rest."""
    done = sorted((r for r in records if r.ok), key=lambda r: r.start)
    if len(done) < 8:
        return False
    head_n = max(2, len(done) // 10)
    head = [r.latency for r in done[:head_n]]
    rest = [r.latency for r in done[head_n:]]
    return percentile(head, 50) > factor * percentile(rest, 50)


#: the fields of a level's document that must be counts, numbers (or null), counts or null
_COUNTS = ("completed", "failed", "not_sent", "in_flight", "input_tokens", "output_tokens")
_FIGURES = ("duration_s", "request_throughput", "output_token_throughput", "total_token_throughput",
            "peak_output_token_throughput", "achieved_concurrency", "goodput", "slo_attainment", "accept_length",
            "accept_length_spec", "spec_step_share", "tokens_per_chunk")
_REQUIRED_FIGURES = _FIGURES[:6]
_NULLABLE_COUNTS = ("concurrency", "max_concurrency")


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
    ttft_vllm_ms: Summary | None = None
    chunk_gap_ms: Summary | None = None
    peak_output_token_throughput: float = 0.0
    token_source: TokenSource = TokenSource.USAGE
    not_sent: int = 0
    in_flight: int = 0  # requests abandoned in flight by an interrupt
    goodput: float | None = None  # requests/s meeting every objective (None: no --goodput)
    slo_attainment: float | None = None
    spec_step_share: float | None = None  # share of request-steps that were speculative
    accept_length_spec: float | None = None  # tokens per speculative request-step only
    tokens_per_chunk: float | None = None  # client-side: output tokens / text chunks
    warming: bool = False
    stopped_early: str | None = None  # why the level stopped before sending everything

    def to_json(self) -> dict[str, Any]:
        def s(x: Summary | None) -> dict[str, float | None] | None:
            return None if x is None else x.to_json()

        def r4(x: float | None) -> float | None:
            return None if x is None else round(x, 4)

        return {
            "concurrency": self.concurrency, "request_rate": self.request_rate,
            "max_concurrency": self.max_concurrency,
            "completed": self.completed, "failed": self.failed, "not_sent": self.not_sent,
            "in_flight": self.in_flight, "errors": dict(self.errors),
            "duration_s": round(self.duration_s, 6),
            "request_throughput": round(self.request_throughput, 4),
            "output_token_throughput": round(self.output_token_throughput, 4),
            "total_token_throughput": round(self.total_token_throughput, 4),
            "peak_output_token_throughput": round(self.peak_output_token_throughput, 4),
            "ttft_ms": s(self.ttft_ms), "ttft_vllm_ms": s(self.ttft_vllm_ms), "tpot_ms": s(self.tpot_ms),
            "itl_ms": s(self.itl_ms), "chunk_gap_ms": s(self.chunk_gap_ms), "e2e_ms": s(self.e2e_ms),
            "achieved_concurrency": round(self.achieved_concurrency, 4),
            "goodput": r4(self.goodput), "slo_attainment": r4(self.slo_attainment),
            "accept_length": r4(self.accept_length), "accept_length_spec": r4(self.accept_length_spec),
            "spec_step_share": r4(self.spec_step_share), "tokens_per_chunk": r4(self.tokens_per_chunk),
            "tokens_estimated": self.tokens_estimated, "token_source": self.token_source.value,
            "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
            "warming": self.warming, "stopped_early": self.stopped_early,
            "interrupted": self.interrupted,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LevelResult:
        """One element of ``levels[]`` (malformed: ValueError or TypeError, as :meth:`Summary.from_json`)."""
        def s(x: Any) -> Summary | None:
            return None if x is None else Summary.from_json(x)

        def summary(x: Any) -> Summary:
            return Summary.from_json(x)

        f = Fields(d)
        errors = d["errors"]
        if not isinstance(errors, dict) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                   for v in errors.values()):
            raise TypeError(f"errors: expected counts by message, got {str(errors)[:60]}")
        for key in _COUNTS:
            f.integer(key, 0, what="a count")
        for key in _FIGURES:  # a figure is a number from 0 (a rate, a duration, a share), or null where it may be
            (f.number if key in _REQUIRED_FIGURES else f.opt_number)(key, 0.0)
        for key in _NULLABLE_COUNTS:
            f.opt_integer(key, 0, what="a count")
        f.opt_number("request_rate", 0.0)
        if d["stopped_early"] is not None and not isinstance(d["stopped_early"], str):
            raise TypeError(f"stopped_early: expected a reason or null, got {d['stopped_early']!r}")
        return cls(
            concurrency=d["concurrency"], request_rate=d["request_rate"], completed=d["completed"],
            failed=d["failed"], errors=dict(errors), duration_s=d["duration_s"],
            request_throughput=d["request_throughput"], output_token_throughput=d["output_token_throughput"],
            total_token_throughput=d["total_token_throughput"], ttft_ms=summary(d["ttft_ms"]),
            tpot_ms=summary(d["tpot_ms"]), itl_ms=summary(d["itl_ms"]), e2e_ms=summary(d["e2e_ms"]),
            achieved_concurrency=d["achieved_concurrency"], accept_length=d["accept_length"],
            tokens_estimated=bool(d["tokens_estimated"]), input_tokens=d["input_tokens"],
            output_tokens=d["output_tokens"], max_concurrency=d["max_concurrency"],
            interrupted=bool(d["interrupted"]), ttft_vllm_ms=s(d["ttft_vllm_ms"]), chunk_gap_ms=s(d["chunk_gap_ms"]),
            peak_output_token_throughput=d["peak_output_token_throughput"],
            token_source=TokenSource(d["token_source"]), not_sent=d["not_sent"], in_flight=d["in_flight"],
            goodput=d["goodput"], slo_attainment=d["slo_attainment"], spec_step_share=d["spec_step_share"],
            accept_length_spec=d["accept_length_spec"], tokens_per_chunk=d["tokens_per_chunk"],
            warming=bool(d["warming"]), stopped_early=d["stopped_early"])


def level_result(records: Sequence[RequestRecord], *, concurrency: int | None,
                 request_rate: float | None, max_concurrency: int | None = None,
                 accept_length: float | None = None, duration_s: float | None = None,
                 interrupted: bool = False, percentiles: Sequence[float] = DEFAULT_PERCENTILES,
                 slo: Mapping[Slo, float] | None = None, spec_step_share: float | None = None,
                 accept_length_spec: float | None = None, in_flight: int = 0, not_sent: int = 0,
                 stopped_early: str | None = None) -> LevelResult:
    """The level's figures from its requests (warm-up requests are not passed in;
    ``not_sent`` requests the level never sent are only counted).

    ``duration_s`` defaults to first start -> last end of the requests sent, as both
    reference tools measure the benchmark from its first request to its last completion.
    """
    sent = list(records)
    done = [r for r in sent if r.ok]
    if duration_s is None:
        duration_s = (max(r.end for r in sent) - min(r.start for r in sent)) if sent else 0.0
    inp = sum(r.prompt_tokens for r in done)
    out = sum(r.output_tokens for r in done)

    def per_s(x: float) -> float:
        return x / duration_s if duration_s > 0 else 0.0

    def summ(values: list[float]) -> Summary:
        return summarize(values, percentiles)

    tpots = [t for r in done if (t := tpot(r.latency, r.ttft, r.output_tokens)) is not None]
    chunks = sum(len(r.chunk_times) for r in done)
    sources = {r.token_source for r in done}
    source = (TokenSource.ESTIMATED if TokenSource.ESTIMATED in sources else
              TokenSource.TOKENIZER if TokenSource.TOKENIZER in sources else TokenSource.USAGE)
    good = sum(1 for r in done if meets_slo(r, slo)) if slo else None
    return LevelResult(
        concurrency=concurrency, request_rate=request_rate, max_concurrency=max_concurrency,
        completed=len(done), failed=len(sent) - len(done), errors=error_groups(sent),
        duration_s=duration_s,
        request_throughput=per_s(len(done)), output_token_throughput=per_s(out),
        total_token_throughput=per_s(inp + out),
        peak_output_token_throughput=peak_output_throughput(done, min((r.start for r in sent), default=0.0),
                                                            duration_s),
        ttft_ms=summ([r.ttft for r in done if r.ttft is not None]),
        ttft_vllm_ms=summ([r.ttft_vllm for r in done if r.ttft_vllm is not None]),
        tpot_ms=summ(tpots),
        itl_ms=summ([x for r in done for x in r.itl]),
        chunk_gap_ms=summ([g for r in done for g in r.chunk_gaps]),
        e2e_ms=summ([r.latency for r in done]),
        achieved_concurrency=per_s(math.fsum(r.latency for r in done)),
        accept_length=accept_length, accept_length_spec=accept_length_spec, spec_step_share=spec_step_share,
        tokens_per_chunk=out / chunks if chunks else None,
        tokens_estimated=source is TokenSource.ESTIMATED, token_source=source,
        input_tokens=inp, output_tokens=out, interrupted=interrupted,
        not_sent=not_sent, in_flight=in_flight,
        goodput=None if good is None else per_s(good),
        slo_attainment=None if good is None else (good / len(done) if done else 0.0),
        warming=warming_tail(done), stopped_early=stopped_early,
    )
