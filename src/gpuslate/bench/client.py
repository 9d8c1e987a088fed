"""One request of ``gpuslate bench``: the body it sends and how its response is timed.

The stream is parsed by :class:`StreamParser`, a pure object fed with
``(arrival time, bytes)`` pairs, so recorded streams can be replayed through
exactly the code that times live ones (tests/bench/test_recorded_streams.py).
Token counts: the server's ``usage`` (asked for with
``stream_options.include_usage``, per chunk too where the engine takes vLLM's
``continuous_usage_stats``), else ``--tokenizer``, else an estimate that the
figures mark as such. See :mod:`gpuslate.bench.metrics` for the definitions.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Mapping
from itertools import pairwise
from typing import Any

import aiohttp

from .._document import MAX_DOCUMENT_BYTES, parse_json
from ..extras import installed
from .metrics import RequestRecord, TokenSource, split_tokens
from .prompts import Prompt
from .tokens import TokenCounter

_ERROR_CHARS = 200  # an error message is cut to this before it is grouped
CHARS_PER_TOKEN = 4  # the estimate without usage or tokenizer (the simulator's and OpenAI's rule of thumb)
#: a whole (not streamed) response, or one event of a stream, is at most this: a server that sends more
#: (or a line without end) fails that request, never the memory of the load generator
MAX_BODY_BYTES = MAX_DOCUMENT_BYTES
MAX_EVENT_BYTES = 4 << 20
#: asyncio's selector transport reads with ``recv(256 KiB)``, and glibc serves an allocation that large
#: with ``mmap``, then ``mremap`` and ``munmap`` it: four system calls for every small SSE chunk
#: (python/cpython#85451), a third of the client's CPU per request at concurrency 64. 64 KiB comes
#: from the heap; a chunk is a few hundred bytes, and a larger buffer is read in several calls.
READ_BYTES = 64 << 10


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _event_decoder() -> tuple[str, Callable[[bytes], Any]]:
    """(name, decode) of the JSON decoder for stream events: orjson where the ``fast`` extra installed
    it (from bytes, about a quarter of the json module's time per event), else the json module,
    refusing NaN and Infinity as orjson does, so that both accept the same events."""
    try:
        import orjson  # lazy: optional (the fast extra)
    except ImportError:
        decode = json.JSONDecoder(parse_constant=_no_constant).decode

        def stdlib(payload: bytes) -> Any:
            try:
                return decode(payload.decode())  # str in: json.loads would sniff each chunk's encoding
            except RecursionError:  # nested deeper than the parser recurses (orjson: a ValueError)
                raise ValueError("an event nested too deep") from None

        return "json", stdlib

    def fast(payload: bytes) -> Any:
        try:
            return orjson.loads(payload)
        except orjson.JSONDecodeError as exc:  # a ValueError: the same as the json module's, by its message
            if str(exc).startswith("depth limit"):
                raise ValueError("an event nested too deep") from None
            raise

    return "orjson", fast


JSON_DECODER, decode_event = _event_decoder()


def _body_encoder() -> Callable[[Any], bytes]:
    """A request body's JSON: orjson's where installed (the fast extra), else the json module's."""
    try:
        import orjson  # lazy: optional (the fast extra)
    except ImportError:
        return lambda doc: json.dumps(doc).encode()
    return orjson.dumps


encode_body = _body_encoder()


async def read_body(resp: aiohttp.ClientResponse, limit: int = MAX_BODY_BYTES) -> bytes:
    """The body of ``resp``, refused (``ValueError``) past ``limit`` bytes, never read further."""
    body = bytearray()
    async for chunk in resp.content.iter_chunked(1 << 16):
        body += chunk
        if len(body) > limit:
            raise ValueError(f"a response of more than {limit} bytes")
    return bytes(body)


def short(message: str) -> str:
    line = " ".join(message.split())
    return line if len(line) <= _ERROR_CHARS else line[: _ERROR_CHARS - 1] + "…"


def error_message(body: bytes) -> str:
    """The ``error.message`` of an OpenAI-shaped error body, else the body's text."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):  # 64 KiB of '[' nests deeper than the parser recurses
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


def chunk_text(obj: dict[str, Any]) -> str:
    """The generated text of a chunk's (or a whole response's) first choice; "" if none."""
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return ""
    return choice_text(choices[0])


def choice_text(choice: dict[str, Any]) -> str:
    """Completions' ``text``, chat's ``delta`` (streamed) or ``message`` ``content``; "" if none or not text."""
    text = choice.get("text")
    if text is None:
        delta = choice.get("delta") or choice.get("message")
        if not isinstance(delta, dict):
            return ""
        # Reasoning models stream their thinking first: it is generated text too.
        text = delta.get("content") or delta.get("reasoning_content")
    return text if isinstance(text, str) else ""


def connect_failure(exc: aiohttp.ClientConnectorError) -> str:
    if isinstance(exc.os_error, ConnectionRefusedError):
        return "connection refused"
    return exc.os_error.strerror or str(exc.os_error) or type(exc.os_error).__name__


# errors that say the server is not there any more (refused, reset, cut off), not that it answered badly
CONNECTION_ERRORS = ("cannot connect", "server disconnected", "response cut short", "ClientOSError")


def is_connection_failure(rec: RequestRecord) -> bool:
    """The server is not there (as opposed to answering with an error)."""
    return rec.error is not None and rec.error.startswith(CONNECTION_ERRORS)


class StreamParser:
    """Server-sent events of one streamed response -> the request's timings and tokens.

    Times are seconds from the request's start. A text chunk is one whose first
    choice carries text (SGLang's rule for TTFT and ITL); any chunk with
    ``choices`` counts for vLLM's TTFT.
    """

    def __init__(self) -> None:
        self.pending = b""
        #: each text chunk: (arrival, its text, the usage object it carried); figures are made in finish()
        self.chunks: list[tuple[float, str, Any]] = []
        self.first_choice: float | None = None
        self.usage: dict[str, Any] | None = None
        self.finished = False
        self.done = False
        self.ended: float | None = None  # when the buffer that ended the stream arrived
        self.error: str | None = None
        self.origin = 0.0  # subtracted from the times fed: the request's start, where they are clock readings

    def feed(self, now: float, data: bytes) -> bool:
        """Parse a network buffer that arrived at ``now``; True once the stream is over
        (``[DONE]`` or an error event). Called for every buffer of every stream, so it does the
        least it can: split, decode, keep what finish() needs."""
        now -= self.origin
        if self.pending:
            data = self.pending + data
        lines = data.split(b"\n")
        self.pending = lines.pop()  # an incomplete last line waits for the next buffer
        if len(data) > MAX_EVENT_BYTES and (len(self.pending) > MAX_EVENT_BYTES
                                            or max(map(len, lines), default=0) > MAX_EVENT_BYTES):
            self.error = f"malformed response: an event line of more than {MAX_EVENT_BYTES} bytes"
            return True
        for line in lines:
            if not line.startswith(b"data:"):
                continue  # blank separators, comments, event: lines
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.finished = self.done = True
                self.ended = now
                return True
            obj = decode_event(payload)
            if type(obj) is not dict:
                continue
            usage = obj.get("usage")
            if usage is not None and type(usage) is dict:
                self.usage = usage
            choices = obj.get("choices")
            if not choices or type(choices) is not list:
                if "error" in obj and "choices" not in obj:
                    self.error = short(f"error in stream: {error_message(payload)}")
                    return True
                continue  # a usage-only chunk, or a malformed one
            if self.first_choice is None:
                self.first_choice = now
            choice = choices[0]
            if type(choice) is not dict:
                continue
            text = choice_text(choice)
            if text:
                self.chunks.append((now, text, usage))
            if choice.get("finish_reason"):
                self.finished = True
        return False

    @property
    def times(self) -> list[float]:
        """Arrival of each text chunk, from the request's start."""
        return [c[0] for c in self.chunks]

    def finish(self, rec: RequestRecord, prompt: Prompt, tokenizer: TokenCounter | None) -> None:
        """Fill ``rec`` from what was parsed (error, TTFTs, chunk times and tokens)."""
        if self.error is not None:
            rec.error = self.error
            return
        if not self.finished:
            rec.error = "stream ended before [DONE]"
            return
        times = self.times
        texts = [c[1] for c in self.chunks]
        rec.ttft = times[0] if times else None
        rec.ttft_vllm = self.first_choice
        rec.chunk_times = times
        count_tokens(rec, prompt, self.usage, "".join(texts), len(times), tokenizer)
        # usage.completion_tokens each text chunk carried (vLLM's continuous_usage_stats): the count so far
        carried = [u.get("completion_tokens") if type(u) is dict else None for _, _, u in self.chunks]
        cum = [c for c in carried if type(c) is int]
        if cum and len(cum) == len(carried) and cum[-1] == rec.output_tokens \
                and all(b >= a for a, b in pairwise(cum)):
            rec.chunk_tokens = _diffs(cum)
        else:
            rec.chunk_tokens = split_tokens(rec.output_tokens, [len(t) for t in texts])


def _diffs(cum: list[int]) -> list[int]:
    out, prev = [], 0
    for c in cum:
        out.append(c - prev)
        prev = c
    return out


def count_tokens(rec: RequestRecord, prompt: Prompt, usage: Any, text: str, chunks: int,
                 tokenizer: TokenCounter | None) -> None:
    """Output and prompt tokens: usage, else the tokenizer, else an estimate (marked)."""
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        rec.output_tokens = usage["completion_tokens"]
        rec.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        rec.token_source = TokenSource.USAGE
        return
    if tokenizer is not None:
        rec.output_tokens = tokenizer.count(text)
        rec.prompt_tokens = tokenizer.count(prompt.text)
        rec.token_source = TokenSource.TOKENIZER
        return
    rec.token_source = TokenSource.ESTIMATED
    rec.output_tokens = max(chunks, round(len(text) / CHARS_PER_TOKEN)) if text else 0
    rec.prompt_tokens = prompt.input_len or math.ceil(len(prompt.text) / CHARS_PER_TOKEN)


def streaming_connections(base: str, connection: str) -> Any:
    """The :class:`~.http1.Http1` the streamed requests go over with pooled connections where the
    ``fast`` extra installed httptools; None (aiohttp carries them) where not, and with
    ``--connection per-request``: that convention is SGLang's client's, whose TTFT holds what a new
    aiohttp connection costs its event loop (at concurrency 64, the set-up of the whole wave's
    connections one after another), so it takes the same path (benchmarks/RESULTS.md, issue 38)."""
    if connection != "pooled" or not installed("httptools"):
        return None
    from .http1 import Http1  # lazy: optional (the fast extra's httptools)

    return Http1(base)


def small_reads(resp: aiohttp.ClientResponse) -> None:
    """Read the response's connection :data:`READ_BYTES` at a time where asyncio's selector transport
    would ask ``recv()`` for 256 KiB (uvloop's and TLS transports have no such knob: left as they are)."""
    conn = resp.connection
    transport = conn.transport if conn is not None else None
    size = getattr(transport, "max_size", None)
    if isinstance(size, int) and size > READ_BYTES:
        setattr(transport, "max_size", READ_BYTES)  # noqa: B010 - not in asyncio.Transport's type


#: the read buffer of the session SGLang's client makes for each request (``_create_bench_client_session``)
PER_REQUEST_READ_BUFSIZE = 10 * 1024**2


class Client:
    """Sends one request and records it, the way the reference tools time it."""

    def __init__(self, session: aiohttp.ClientSession, base: str, plan: Any, model: str, *,
                 headers: Mapping[str, str], continuous_usage: bool = False,
                 tokenizer: TokenCounter | None = None) -> None:
        self.session = session
        self.plan = plan
        self.model = model
        path = "/v1/completions" if plan.api == "completions" else "/v1/chat/completions"
        self.url = base + path
        self.timeout = aiohttp.ClientTimeout(total=plan.timeout_s)
        self.headers = {"Content-Type": "application/json", **headers}
        self.continuous_usage = continuous_usage
        self.tokenizer = tokenizer
        self.in_flight: dict[int, tuple[float, StreamParser | None]] = {}
        self.path = path
        self.http1 = streaming_connections(base, plan.connection) if plan.stream else None

    def close(self) -> None:
        """Close the idle connections of the streamed requests (aiohttp's session closes its own)."""
        if self.http1 is not None:
            self.http1.close()

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
            if self.continuous_usage:
                body["stream_options"]["continuous_usage_stats"] = True
        if p.ignore_eos:
            body["ignore_eos"] = True
        body.update(p.extra_body or {})  # --extra-body wins, as in vLLM and SGLang
        return body

    async def send(self, prompt: Prompt) -> RequestRecord:
        if self.http1 is not None:
            return await self._send_http1(prompt)
        if self.plan.connection == "per-request":
            # SGLang's client makes an aiohttp session per request, before its clock starts, and its
            # first request then connects: the connection's set-up counts in TTFT as it does there
            async with aiohttp.ClientSession(timeout=self.timeout, read_bufsize=PER_REQUEST_READ_BUFSIZE) as session:
                return await self._send(session, prompt)
        return await self._send(self.session, prompt)

    async def _send(self, session: aiohttp.ClientSession, prompt: Prompt) -> RequestRecord:
        rec = RequestRecord()
        payload = encode_body(self.body(prompt))
        rec.start = st = time.perf_counter()
        key = id(rec)
        self.in_flight[key] = (st, None)
        ended: float | None = None
        try:
            async with session.post(self.url, data=payload, timeout=self.timeout, headers=self.headers) as resp:
                small_reads(resp)
                if resp.status != 200:
                    rec.error = short(f"HTTP {resp.status}: {error_message(await resp.content.read(65536))}")
                elif self.plan.stream:
                    parser = StreamParser()
                    self.in_flight[key] = (st, parser)
                    async for data in resp.content.iter_any():
                        if parser.feed(time.perf_counter() - st, data):
                            break
                    parser.finish(rec, prompt, self.tokenizer)
                    ended = parser.ended
                else:
                    await self._read_whole(resp, rec, prompt, st)
        except asyncio.TimeoutError:
            rec.error = f"timeout after {self.plan.timeout_s:g} s"
        except aiohttp.ClientConnectorError as exc:
            rec.error = short(f"cannot connect: {connect_failure(exc)}")
        except aiohttp.ServerDisconnectedError:
            rec.error = "server disconnected"
        except aiohttp.ClientPayloadError as exc:
            rec.error = short(f"response cut short: {exc}")
        except aiohttp.ClientError as exc:
            rec.error = short(f"{type(exc).__name__}: {exc}")
        except ValueError as exc:  # malformed JSON in a response
            rec.error = short(f"malformed response: {exc}")
        finally:
            self.in_flight.pop(key, None)
        # E2E ends where the stream did (the buffer with [DONE]), as SGLang's client stamps that line: not
        # after the parsing and the connection's release (its close, with --connection per-request)
        rec.latency = ended if ended is not None and rec.error is None else time.perf_counter() - st
        rec.ok = rec.error is None
        return rec

    async def _send_http1(self, prompt: Prompt) -> RequestRecord:
        """:meth:`send` of a streamed request over :mod:`.http1`: the same record, timed the same way."""
        from .http1 import HttpFailure  # lazy: optional (http1 needs the fast extra's httptools)

        assert self.http1 is not None
        rec = RequestRecord()
        payload = encode_body(self.body(prompt))
        head = self.http1.request_head(self.path, self.headers, len(payload))
        parser = StreamParser()
        rec.start = st = time.perf_counter()
        key = id(rec)
        self.in_flight[key] = (st, parser)

        parser.origin = st  # the connection stamps each buffer with perf_counter(): the parser subtracts st
        try:
            status, body = await self.http1.post(head, payload, parser.feed, self.plan.timeout_s)
            if status != 200:
                rec.error = short(f"HTTP {status}: {error_message(body)}")
            else:
                parser.finish(rec, prompt, self.tokenizer)
        except asyncio.TimeoutError:
            rec.error = f"timeout after {self.plan.timeout_s:g} s"
        except HttpFailure as exc:
            rec.error = short(str(exc))
        finally:
            self.in_flight.pop(key, None)
        ended = parser.ended
        rec.latency = ended if ended is not None and rec.error is None else time.perf_counter() - st
        rec.ok = rec.error is None
        return rec

    async def _read_whole(self, resp: aiohttp.ClientResponse, rec: RequestRecord,
                          prompt: Prompt, st: float) -> None:
        obj = parse_json(await read_body(resp))
        rec.ttft = rec.ttft_vllm = time.perf_counter() - st  # no stream: the first token arrives with the last
        text = chunk_text(obj) if isinstance(obj, dict) else ""
        usage = obj.get("usage") if isinstance(obj, dict) else None
        count_tokens(rec, prompt, usage, text, 1 if text else 0, self.tokenizer)
        rec.chunk_times = [rec.ttft] if text else []
        rec.chunk_tokens = [rec.output_tokens] if text else []

    def in_flight_now(self) -> list[dict[str, Any]]:
        """The requests still waiting for their end: how long, and what arrived so far."""
        now = time.perf_counter()
        return [{"elapsed_s": round(now - st, 3), "chunks_received": len(p.chunks) if p else 0}
                for st, p in self.in_flight.values()]
