"""Recorded server-sent-event streams through the metric code, each figure checked by hand.

The parser (gpuslate.bench.client.StreamParser) is what times live streams: here it is
fed the same bytes with chosen arrival times, so every figure has a known answer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslate.bench.client import StreamParser
from gpuslate.bench.metrics import RequestRecord, TokenSource, level_result
from gpuslate.bench.prompts import Prompt
from gpuslate.bench.tokens import load_tokenizer
from simproc import word_tokenizer

PROMPT = Prompt(" the and for", 8, 3)


def sse(obj: Any) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


def cmpl(text: str, finish: str | None = None, usage: dict[str, int] | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {"object": "text_completion", "choices": [{"index": 0, "text": text,
                                                                      "finish_reason": finish}]}
    if usage is not None:
        doc["usage"] = usage
    return doc


def chat(content: str | None = None, role: bool = False, finish: str | None = None) -> dict[str, Any]:
    delta: dict[str, Any] = {"role": "assistant"} if role else {}
    if content is not None:
        delta["content"] = content
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def usage(completion: int, prompt: int = 3) -> dict[str, Any]:
    return {"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                     "total_tokens": prompt + completion}}


def replay(events: list[tuple[float, bytes]], latency: float, tokenizer: Any = None) -> RequestRecord:
    rec = RequestRecord(start=0.0)
    p = StreamParser()
    for t, data in events:
        if p.feed(t, data):
            break
    p.finish(rec, PROMPT, tokenizer)
    rec.latency = latency
    rec.ok = rec.error is None
    return rec


def test_single_token_chunks_with_final_usage() -> None:
    rec = replay([(0.10, sse(cmpl(" a"))), (0.15, sse(cmpl(" b"))), (0.22, sse(cmpl(" c"))),
                  (0.30, sse(cmpl(" d", "length"))), (0.31, sse(usage(4))), (0.31, sse(b"[DONE]"))], 0.31)
    assert rec.ok and rec.token_source is TokenSource.USAGE and rec.output_tokens == 4 and rec.prompt_tokens == 3
    assert rec.ttft == rec.ttft_vllm == 0.10
    assert rec.chunk_gaps == pytest.approx([0.05, 0.07, 0.08])
    assert rec.itl == pytest.approx([0.05, 0.07, 0.08])  # one token a chunk: ITL is the chunk gap
    lv = level_result([rec], concurrency=1, request_rate=None)
    assert lv.tpot_ms.mean == pytest.approx((0.31 - 0.10) / 3 * 1000)
    assert lv.itl_ms.mean == pytest.approx(1000 * 0.20 / 3) and lv.itl_ms.p50 == pytest.approx(70.0)
    assert lv.e2e_ms.mean == pytest.approx(310.0)


def test_multi_token_chunks_with_continuous_usage() -> None:
    """Speculative decoding: 1, then 3, then 2 tokens a chunk, each chunk saying the count so far."""
    rec = replay([(0.10, sse(cmpl(" a", usage={"completion_tokens": 1, "prompt_tokens": 3}))),
                  (0.20, sse(cmpl(" b c d", usage={"completion_tokens": 4, "prompt_tokens": 3}))),
                  (0.26, sse(cmpl(" e f", "length", usage={"completion_tokens": 6, "prompt_tokens": 3}))),
                  (0.27, sse(usage(6))), (0.27, sse(b"[DONE]"))], 0.27)
    assert rec.chunk_tokens == [1, 3, 2]
    # SGLang: each gap split over its tokens and counted once per token
    assert rec.itl == pytest.approx([0.1 / 3] * 3 + [0.06 / 2] * 2)
    assert rec.chunk_gaps == pytest.approx([0.10, 0.06])
    lv = level_result([rec], concurrency=1, request_rate=None)
    assert lv.itl_ms.mean == pytest.approx(1000 * 0.16 / 5)  # per token: 32 ms, not the 80 ms chunk gap
    assert lv.chunk_gap_ms.mean == pytest.approx(80.0)
    assert lv.tpot_ms.mean == pytest.approx(1000 * (0.27 - 0.10) / 5)
    assert lv.tokens_per_chunk == pytest.approx(2.0)
    # a level shorter than a second is one window: its peak is its mean, never below it
    assert lv.peak_output_token_throughput == pytest.approx(6 / 0.27) == pytest.approx(lv.output_token_throughput)


def test_multi_token_chunks_with_final_usage_only_split_by_text_length() -> None:
    rec = replay([(0.1, sse(cmpl(" aa"))), (0.2, sse(cmpl(" bb cc dd"))), (0.3, sse(cmpl("", "length"))),
                  (0.3, sse(usage(4))), (0.3, sse(b"[DONE]"))], 0.3)
    assert rec.chunk_tokens == [1, 3]  # 3 and 9 characters: 4 tokens split 1 : 3
    assert rec.itl == pytest.approx([0.1 / 3] * 3)


def test_chat_role_only_chunk_is_vllm_ttft_not_sglang_ttft() -> None:
    rec = replay([(0.05, sse(chat(role=True, content=""))), (0.12, sse(chat(" hi"))), (0.20, sse(chat(" there"))),
                  (0.21, sse(chat(finish="stop"))), (0.21, sse(usage(2))), (0.22, sse(b"[DONE]"))], 0.22)
    assert rec.ttft_vllm == 0.05  # vLLM: first chunk with any choices
    assert rec.ttft == 0.12  # SGLang: first chunk with text
    assert rec.chunk_gaps == pytest.approx([0.08])
    lv = level_result([rec], concurrency=1, request_rate=None)
    assert lv.ttft_ms.mean == pytest.approx(120.0) and lv.ttft_vllm_ms.mean == pytest.approx(50.0)


def test_no_usage_is_estimated_and_a_tokenizer_counts_exactly(tmp_path: Path) -> None:
    events = [(0.1, sse(cmpl(" the quick"))), (0.2, sse(cmpl(" brown fox jumps", "length"))), (0.2, sse(b"[DONE]"))]
    rec = replay(events, 0.2)
    # 25 characters: ~4 a token -> 6, marked as an estimate (never silently a count)
    assert rec.token_source is TokenSource.ESTIMATED and rec.output_tokens == 6 and rec.tokens_estimated
    assert rec.prompt_tokens == 3  # the prompt's intended length
    assert level_result([rec], concurrency=1, request_rate=None).tokens_estimated
    tok = load_tokenizer(str(word_tokenizer(tmp_path)))
    rec = replay(events, 0.2, tok)
    assert rec.token_source is TokenSource.TOKENIZER and rec.output_tokens == 5 and rec.prompt_tokens == 3
    assert rec.chunk_tokens == [2, 3]
    lv = level_result([rec], concurrency=1, request_rate=None)
    assert not lv.tokens_estimated and lv.token_source is TokenSource.TOKENIZER
    assert lv.itl_ms.mean == pytest.approx(1000 * 0.1 / 3)


def test_error_mid_stream_fails_the_request() -> None:
    rec = replay([(0.1, sse(cmpl(" a"))),
                  (0.2, sse({"error": {"message": "the server is shutting down", "code": 503}})),
                  (0.3, sse(cmpl(" never")))], 0.2)
    assert not rec.ok and rec.error == "error in stream: the server is shutting down"
    lv = level_result([rec], concurrency=1, request_rate=None)
    assert lv.completed == 0 and lv.failed == 1 and lv.errors == {rec.error: 1}
    assert lv.itl_ms.mean is None and lv.ttft_ms.mean is None  # a failed request counts in no latency


def test_stream_cut_before_done_and_buffers_split_mid_line() -> None:
    whole = sse(cmpl(" a")) + sse(cmpl(" b", "length")) + sse(usage(2)) + sse(b"[DONE]")
    n = len(sse(cmpl(" a")))
    rec = replay([(0.1, whole[:7]), (0.15, whole[7:n]), (0.2, whole[n:])], 0.2)
    assert rec.ok and rec.output_tokens == 2 and rec.ttft == 0.15  # the first chunk completed at 0.15
    rec = replay([(0.1, sse(cmpl(" a")))], 0.1)
    assert rec.error == "stream ended before [DONE]"


def test_peak_output_throughput_over_windows_that_tile_the_level() -> None:
    a = replay([(0.5, sse(cmpl(" a b", usage={"completion_tokens": 2}))),
                (1.5, sse(cmpl(" c d e", "length", usage={"completion_tokens": 5}))),
                (1.6, sse(b"[DONE]"))], 1.6)
    b = RequestRecord(ok=True, start=1.0, ttft=0.1, latency=1.4, chunk_times=[0.1, 1.3], chunk_tokens=[4, 4],
                      output_tokens=8)
    lv = level_result([a, b], concurrency=2, request_rate=None)
    # 2.4 s: two windows of 1.2 s; the first holds a's 2 and b's first 4, the second a's 3 and b's last 4
    assert lv.duration_s == pytest.approx(2.4)
    assert lv.peak_output_token_throughput == pytest.approx(7 / 1.2)
    assert lv.peak_output_token_throughput >= lv.output_token_throughput
    # vLLM's whole-second buckets would end in a partial one (2.0-2.4 s, b's last 4 alone): never used


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 30), st.lists(st.tuples(st.floats(0.001, 5), st.integers(1, 8)),
                                                        min_size=1, max_size=6)), min_size=1, max_size=8))
def test_peak_is_never_below_the_mean(requests: list[tuple[float, list[tuple[float, int]]]]) -> None:
    recs = []
    for start, chunks in requests:
        times = sorted(t for t, _ in chunks)
        recs.append(RequestRecord(ok=True, start=start, ttft=times[0], latency=times[-1], chunk_times=times,
                                  chunk_tokens=[n for _, n in chunks], output_tokens=sum(n for _, n in chunks)))
    lv = level_result(recs, concurrency=len(recs), request_rate=None)
    assert lv.peak_output_token_throughput >= lv.output_token_throughput * (1 - 1e-9)
