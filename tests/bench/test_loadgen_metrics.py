"""Pure parts of the load generator: metric definitions, plans, URLs, prompts (hypothesis)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslate.bench import LoadPlan, parse_levels
from gpuslate.bench.metrics import (
    RequestRecord,
    Slo,
    TokenSource,
    level_result,
    per_token_itl,
    percentile,
    split_tokens,
    summarize,
    tpot,
)
from gpuslate.bench.plan import normalize_url
from gpuslate.bench.prompts import PromptSource, load_dataset, random_prompts
from gpuslate.bench.serverinfo import SpecCounters, accept_length_between, acceptance_between, prom_sum
from gpuslate.errors import UsageError
from gpuslate.simserver.openai_api import count_prompt_tokens

floats = st.floats(min_value=0.0, max_value=1e4, allow_nan=False, allow_infinity=False)


@settings(deadline=None)  # timing-free properties; a loaded CI machine must not fail them
@given(st.lists(floats, min_size=1, max_size=60), st.floats(min_value=0, max_value=100))
def test_percentile_is_numpy_linear(values: list[float], q: float) -> None:
    np = pytest.importorskip("numpy")
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-9, abs=1e-9)


@settings(deadline=None)  # timing-free properties; a loaded CI machine must not fail them
@given(st.lists(floats, min_size=1, max_size=60), st.floats(0, 100), st.floats(0, 100))
def test_percentile_bounded_and_monotone(values: list[float], q1: float, q2: float) -> None:
    lo, hi = sorted((q1, q2))
    assert min(values) <= percentile(values, lo) <= percentile(values, hi) <= max(values) + 1e-9
    assert percentile(values, 0) == min(values) and percentile(values, 100) == max(values)


def test_percentile_rejects_nothing_and_bad_q() -> None:
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


@settings(deadline=None)  # timing-free properties; a loaded CI machine must not fail them
@given(st.lists(floats, max_size=40))
def test_summarize_in_ms(values: list[float]) -> None:
    s = summarize(values)
    if not values:
        assert (s.mean, s.p50, s.pct(90), s.p99, s.std, s.max) == (None,) * 6
        return
    np = pytest.importorskip("numpy")
    assert s.std == pytest.approx(1000 * float(np.std(values)), rel=1e-6, abs=1e-6)
    assert s.max == pytest.approx(1000 * max(values))
    assert s.mean == pytest.approx(1000 * sum(values) / len(values), rel=1e-9, abs=1e-9)
    assert s.p50 == pytest.approx(1000 * percentile(values, 50), rel=1e-9, abs=1e-9)
    assert s.p50 <= s.pct(90) + 1e-9 <= s.p99 + 2e-9  # type: ignore[operator]


@settings(deadline=None)  # timing-free properties; a loaded CI machine must not fail them
@given(floats, floats, st.integers(min_value=-3, max_value=10_000))
def test_tpot_definition(latency: float, ttft: float, n: int) -> None:
    value = tpot(latency, ttft, n)
    if n <= 1:
        assert value is None  # 0 or 1 output tokens: no time *between* tokens to share out
    else:
        assert value == pytest.approx((latency - ttft) / (n - 1))
    assert tpot(latency, None, n) is None


record = st.builds(
    RequestRecord, ok=st.booleans(), error=st.sampled_from([None, "HTTP 500: boom", "timeout after 1 s"]),
    start=st.floats(0, 100), ttft=st.one_of(st.none(), st.floats(0, 1)), latency=st.floats(0.001, 10),
    chunk_times=st.lists(st.floats(0, 0.1), max_size=5).map(sorted), prompt_tokens=st.integers(0, 1000),
    output_tokens=st.integers(0, 1000), token_source=st.sampled_from(list(TokenSource)))


@settings(max_examples=200, deadline=None)
@given(st.lists(record, max_size=30))
def test_level_result_definitions(records: list[RequestRecord]) -> None:
    for r in records:
        r.chunk_tokens = split_tokens(max(r.output_tokens, len(r.chunk_times)), [3] * len(r.chunk_times))
        if not r.ok and r.error is None:
            r.error = "x"
        if r.ok:
            r.error = None
    lv = level_result(records, concurrency=4, request_rate=None)
    done = [r for r in records if r.ok]
    assert lv.completed == len(done) and lv.failed == len(records) - len(done)
    assert sum(lv.errors.values()) == lv.failed
    duration = (max(r.end for r in records) - min(r.start for r in records)) if records else 0.0
    assert lv.duration_s == pytest.approx(duration)
    out = sum(r.output_tokens for r in done)
    inp = sum(r.prompt_tokens for r in done)
    assert lv.output_tokens == out and lv.input_tokens == inp
    if duration > 0:
        assert lv.request_throughput == pytest.approx(len(done) / duration)
        assert lv.output_token_throughput == pytest.approx(out / duration)
        assert lv.total_token_throughput == pytest.approx((inp + out) / duration)
        assert lv.achieved_concurrency == pytest.approx(math.fsum(r.latency for r in done) / duration)
    tpots = [t for r in done if (t := tpot(r.latency, r.ttft, r.output_tokens)) is not None]
    assert (lv.tpot_ms.mean is None) == (not tpots)
    assert (lv.itl_ms.mean is None) == (not any(r.itl for r in done))
    assert (lv.chunk_gap_ms.mean is None) == (not any(r.chunk_gaps for r in done))
    assert lv.tokens_estimated == any(r.tokens_estimated for r in done)
    doc = lv.to_json()
    assert set(doc["ttft_ms"]) == {"mean", "std", "max", "p50", "p90", "p95", "p99"}
    json.dumps(doc)


@settings(deadline=None)
@given(st.integers(0, 500), st.lists(st.integers(0, 40), min_size=1, max_size=30))
def test_split_tokens_sums_and_is_proportional(total: int, chars: list[int]) -> None:
    parts = split_tokens(total, chars)
    assert sum(parts) == total and len(parts) == len(chars) and min(parts) >= 0
    if total >= len(chars):
        assert min(parts) >= 1  # every chunk that carried text carried a token


@settings(deadline=None)
@given(st.lists(st.tuples(st.floats(0.0001, 0.1), st.integers(1, 6)), min_size=2, max_size=20))
def test_per_token_itl_mean_is_time_over_tokens(chunks: list[tuple[float, int]]) -> None:
    times, t = [], 0.0
    for gap, _ in chunks:
        t += gap
        times.append(t)
    tokens = [n for _, n in chunks]
    itl = per_token_itl(times, tokens)
    assert len(itl) == sum(tokens[1:])  # one sample per token after the first chunk
    assert math.fsum(itl) == pytest.approx(times[-1] - times[0])


def test_goodput_counts_requests_meeting_every_objective() -> None:
    fast = RequestRecord(ok=True, start=0.0, ttft=0.1, latency=1.0, output_tokens=10)
    slow_ttft = RequestRecord(ok=True, start=0.0, ttft=0.6, latency=1.0, output_tokens=10)
    slow_tpot = RequestRecord(ok=True, start=0.0, ttft=0.1, latency=2.0, output_tokens=10)  # 211 ms/token
    lv = level_result([fast, slow_ttft, slow_tpot], concurrency=3, request_rate=None,
                      slo={Slo.TTFT: 500.0, Slo.TPOT: 150.0})
    assert lv.slo_attainment == pytest.approx(1 / 3)
    assert lv.goodput == pytest.approx(1 / lv.duration_s)
    assert level_result([fast], concurrency=1, request_rate=None).goodput is None  # no objectives: no figure


def test_errors_grouped_most_frequent_first() -> None:
    recs = [RequestRecord(error="b"), RequestRecord(error="a"), RequestRecord(error="a"),
            RequestRecord(ok=True, latency=1.0)]
    lv = level_result(recs, concurrency=1, request_rate=None)
    assert list(lv.errors.items()) == [("a", 2), ("b", 1)]


@settings(deadline=None)  # timing-free properties; a loaded CI machine must not fail them
@given(st.lists(st.integers(1, 10_000), min_size=1, max_size=10))
def test_parse_levels_round_trip(levels: list[int]) -> None:
    assert parse_levels(",".join(map(str, levels))) == tuple(levels)
    assert parse_levels(" , ".join(map(str, levels))) == tuple(levels)


@pytest.mark.parametrize("text", ["", " ", "0", "-1", "a", "1,,2", "1,", "1.5", "99999999", "1e3", "+4"])
def test_parse_levels_rejects(text: str) -> None:
    with pytest.raises(UsageError):
        parse_levels(text)


@pytest.mark.parametrize(("url", "base"), [
    ("http://127.0.0.1:30000", "http://127.0.0.1:30000"),
    ("http://127.0.0.1:30000/", "http://127.0.0.1:30000"),
    ("http://127.0.0.1:30000/v1", "http://127.0.0.1:30000"),
    ("http://[::1]:8000/v1/", "http://[::1]:8000"),
    ("https://host/prefix", "https://host/prefix"),
])
def test_normalize_url(url: str, base: str) -> None:
    assert normalize_url(url) == base


@pytest.mark.parametrize("url", ["", "127.0.0.1:30000", "ftp://h", "http://", "http://h:99999",
                                 "http://h:x", "http://h/?q=1"])
def test_normalize_url_rejects(url: str) -> None:
    with pytest.raises(UsageError):
        normalize_url(url)


@pytest.mark.parametrize("plan", [
    LoadPlan(concurrency=()), LoadPlan(concurrency=(1, 0)), LoadPlan(concurrency=(10**6,)),
    LoadPlan(request_rate=0.0), LoadPlan(request_rate=float("nan")), LoadPlan(request_rate=-2.0),
    LoadPlan(request_rate=float("inf"), requests=None, duration_s=1.0), LoadPlan(request_rate=1.0, burstiness=0),
    LoadPlan(random_range_ratio=1.0), LoadPlan(percentiles=(101,)), LoadPlan(percentiles=()),
    LoadPlan(headers=(("X-A", "b\nc"),)), LoadPlan(api_key=""), LoadPlan(extra_body=[]),  # type: ignore[arg-type]
    LoadPlan(request_rate=1.0, max_concurrency=0), LoadPlan(requests=0), LoadPlan(requests=None),
    LoadPlan(duration_s=0.0), LoadPlan(duration_s=float("nan")), LoadPlan(warmup=-1),
    LoadPlan(api="embeddings"),  # type: ignore[arg-type]
    LoadPlan(input_len=0), LoadPlan(output_len=-5), LoadPlan(timeout_s=0.0), LoadPlan(model=""),
    LoadPlan(concurrency=(True,)),  # type: ignore[arg-type]
])
def test_bad_plans(plan: LoadPlan) -> None:
    with pytest.raises(UsageError):
        plan.validate()


def test_good_plans() -> None:
    LoadPlan().validate()
    LoadPlan(request_rate=2.5, max_concurrency=8, requests=None, duration_s=3).validate()
    assert LoadPlan(concurrency=(1, 8, 2)).peak_concurrency == 8
    assert LoadPlan(concurrency=(1, 2)).to_json()["concurrency"] == [1, 2]
    LoadPlan(request_rate=float("inf"), requests=10).validate()
    secret = LoadPlan(api_key="sk-secret", headers=(("X-Token", "hidden"),))
    doc = json.dumps(secret.to_json())
    assert "sk-secret" not in doc and "hidden" not in doc and "sk-secret" not in repr(secret)
    assert secret.request_headers() == {"X-Token": "hidden", "Authorization": "Bearer sk-secret"}


@settings(deadline=None)  # timing-free properties; a loaded CI machine must not fail them
@given(st.integers(1, 300), st.integers(0, 2**32))
def test_random_prompts_have_the_requested_length(n: int, seed: int) -> None:
    (p,) = random_prompts(1, n, 7, seed)
    # one token per word for the simulator's ceil(chars/4) rule (and for BPE vocabularies)
    assert count_prompt_tokens(p.text) == n and len(p.text.split()) == n
    assert p.output_len == 7 and p.input_len == n
    assert random_prompts(1, n, 7, seed) == [p]  # reproducible


def test_dataset_jsonl_and_sharegpt(tmp_path: Path) -> None:
    jl = tmp_path / "p.jsonl"
    jl.write_text('{"prompt": "hello"}\n\n{"prompt": "bye", "output_len": 3}\n')
    a, b = load_dataset(str(jl), 9)
    assert (a.text, a.output_len, b.text, b.output_len) == ("hello", 9, "bye", 3)
    sg = tmp_path / "sharegpt.json"
    sg.write_text(json.dumps([
        {"id": "1", "conversations": [{"from": "human", "value": "Q1"}, {"from": "gpt", "value": "A1"}]},
        {"id": "2", "conversations": [{"from": "gpt", "value": "only an answer"}]},
        {"id": "3", "conversations": [{"from": "human", "value": "Q3"}]},
    ]))
    assert [p.text for p in load_dataset(str(sg), 5)] == ["Q1", "Q3"]
    src = PromptSource(input_len=4, output_len=5, seed=1, dataset=load_dataset(str(sg), 5))
    assert sorted(src.take().text for _ in range(4)) == ["Q1", "Q1", "Q3", "Q3"]


@pytest.mark.parametrize(("content", "where"), [
    ('{"prompt": "ok"}\n{"prompt": 5}\n', ":2:"),
    ('{"prompt": "ok"}\nnot json\n', ":2: invalid JSON"),
    ('{"text": "x"}\n', ":1: expected an object"),
    ('{"prompt": "x", "output_len": 0}\n', ":1:"),
    ("[\n{\"prompt\": 1\n", ":3: invalid JSON"),
    ("\n\n", ": the dataset holds no prompts"),
])
def test_dataset_errors_name_file_and_line(tmp_path: Path, content: str, where: str) -> None:
    f = tmp_path / "d.jsonl"
    f.write_text(content)
    with pytest.raises(UsageError, match="d.jsonl" + where):
        load_dataset(str(f), 4)


def test_prometheus_counters_and_accept_length() -> None:
    text = ('# HELP x\nvllm:spec_decode_num_drafts_total{model_name="m"} 10.0\n'
            'vllm:spec_decode_num_drafts_total{model_name="n"} 5.0\n'
            'vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 20\n'
            'vllm:spec_decode_num_drafts_created 99\n')
    assert prom_sum(text, "vllm:spec_decode_num_drafts_total") == 15.0
    assert prom_sum(text, "vllm:spec_decode_num_accepted_tokens_total") == 20.0
    assert prom_sum(text, "vllm:nothing") is None
    before, after = SpecCounters(10, 5, None), SpecCounters(40, 15, None)
    assert accept_length_between(before, after) == 3.0
    assert accept_length_between(after, after) is None  # no speculative step in between
    assert accept_length_between(None, SpecCounters(0, 0, 2.5)) == 2.5  # only the running mean
    assert accept_length_between(before, None) is None


def test_acceptance_over_all_steps_and_speculative_share() -> None:
    # 10 speculative request-steps gave 30 tokens; 90 plain ones gave 90: over all steps 1.2
    before = SpecCounters(0, 0, None, 0, 0)
    after = SpecCounters(30, 10, None, 120, 100)
    acc = acceptance_between(before, after)
    assert acc.spec_steps == 3.0 and acc.all_steps == pytest.approx(1.2) and acc.spec_share == pytest.approx(0.1)
    assert acceptance_between(before, SpecCounters(30, 10, None)).all_steps is None  # no totals: unknown


def test_a_level_whose_first_requests_were_slow_is_flagged_warming() -> None:
    """transformers serve at a new concurrency: the first requests carried 4-5 s, then ~1.2 s."""
    from gpuslate.bench.metrics import warming_tail

    def recs(latencies: list[float]) -> list[RequestRecord]:
        return [RequestRecord(ok=True, start=float(i), latency=x) for i, x in enumerate(latencies)]

    assert warming_tail(recs([4.5, 5.0] + [1.2] * 18))
    assert not warming_tail(recs([1.3, 1.1] + [1.2] * 18))
    assert not warming_tail(recs([1.2] * 18 + [4.5, 5.0]))  # a slow end is not warming up
    assert not warming_tail(recs([5.0, 5.0, 1.0]))  # too few to tell
    lv = level_result(recs([4.5, 5.0] + [1.2] * 18), concurrency=2, request_rate=None)
    assert lv.warming and lv.to_json()["warming"] is True
