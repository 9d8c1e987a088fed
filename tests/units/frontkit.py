"""A client at constant concurrency for the front tests and benchmarks/bench_front.py: N workers, each
sending one streaming completion after another for the whole run, every request recorded (when it
was sent, when its first and last bytes came, how it ended). A stream that ends without ``[DONE]``
is *cut*; an HTTP error, a refused connection, a reset or an error event in the stream is *failed*.

Servers that end a stream without ``data: [DONE]`` (``transformers serve`` 5.x: its last event is
the chunk whose ``finish_reason`` is set, ``cli/serving/completion.py``) are read with
``end="finish"``: a stream is then whole once a chunk says why it finished (``[DONE]`` too).
The body holds only fields every OpenAI-compatible server takes (``transformers serve`` answers
422 to any it does not know, such as vLLM's ``ignore_eos``)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass

import aiohttp


@dataclass
class Req:
    start: float  # time.monotonic() it was sent
    end: float = 0.0
    first: float | None = None  # first body byte
    status: int | None = None
    error: str | None = None  # failed: HTTP error, refused, reset
    cut: bool = False  # 200, then the stream ended before [DONE]
    chunks: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None and not self.cut

    @property
    def latency(self) -> float:
        return self.end - self.start


class StreamLoad:
    """``concurrency`` workers streaming completions of ``model`` to ``url`` (a base URL) until
    :meth:`stop`; ``end``: what makes a stream whole, ``"done"`` (``data: [DONE]``) or ``"finish"``
    (that, or a chunk with a ``finish_reason``)."""

    def __init__(self, url: str, *, concurrency: int = 8, max_tokens: int = 16, timeout: float = 60.0,
                 model: str = "sim-model", end: str = "done") -> None:
        if end not in ("done", "finish"):
            raise ValueError(f"end: 'done' or 'finish', not {end!r}")
        self.url = url.rstrip("/") + "/v1/completions"
        self.concurrency, self.max_tokens, self.timeout = concurrency, max_tokens, timeout
        self.model, self.end = model, end
        self.records: list[Req] = []
        self._stop = threading.Event()
        self._started = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="streamload", daemon=True)

    def __enter__(self) -> StreamLoad:
        self._thread.start()
        self._started.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self, wait: float | None = None) -> list[Req]:
        """The records, once the requests in flight ended (at most ``wait`` s, else their own
        timeout: one still running then has ``end`` 0)."""
        self._stop.set()
        self._thread.join(self.timeout + 10 if wait is None else wait)
        return list(self.records)

    def done(self) -> int:
        return sum(1 for r in self.records if r.end)

    def wait_done(self, n: int, timeout: float = 30.0) -> None:
        """Until ``n`` more requests than now have finished (the load is flowing)."""
        target = self.done() + n
        deadline = time.monotonic() + timeout
        while self.done() < target:
            if time.monotonic() > deadline:
                raise AssertionError(f"the load did not finish {n} requests in {timeout:g} s: {self.records[-3:]}")
            time.sleep(0.005)

    async def _main(self) -> None:
        conn = aiohttp.TCPConnector(limit=0, force_close=False)
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=self.timeout)) as s:
            self._started.set()
            await asyncio.gather(*(self._worker(s) for _ in range(self.concurrency)))

    async def _worker(self, s: aiohttp.ClientSession) -> None:
        body = {"model": self.model, "prompt": "hello", "max_tokens": self.max_tokens, "stream": True,
                "temperature": 0.0}
        while not self._stop.is_set():
            r = Req(start=time.monotonic())
            self.records.append(r)
            try:
                async with s.post(self.url, json=body) as resp:
                    r.status = resp.status
                    if resp.status != 200:
                        r.error = f"HTTP {resp.status}: {(await resp.read())[:200]!r}"
                    else:
                        done = False
                        async for line in resp.content:
                            if r.first is None:
                                r.first = time.monotonic()
                            if line.startswith(b"data:"):
                                r.chunks += 1
                                if line.strip() == b"data: [DONE]":
                                    done = True
                                elif self.end == "finish":
                                    event = _event(line)
                                    if event.get("error") is not None:
                                        r.error = f"error event: {str(event['error'])[:200]}"
                                    elif _finished(event):
                                        done = True
                        r.cut = not done and r.error is None
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                r.error = f"{type(exc).__name__}: {exc}"
            r.end = time.monotonic()


def _event(line: bytes) -> dict:
    """A stream's ``data:`` line as its JSON object ({} when it is not one)."""
    try:
        doc = json.loads(line[len(b"data:"):])
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _finished(event: dict) -> bool:
    """Whether a completion chunk says why it finished (its last one, ``finish_reason`` set)."""
    choices = event.get("choices")
    return isinstance(choices, list) and any(isinstance(c, dict) and c.get("finish_reason") for c in choices)


def summary(records: list[Req]) -> str:
    failed = [r for r in records if r.error]
    cut = [r for r in records if r.cut]
    return (f"{len(records)} requests, {len(failed)} failed, {len(cut)} cut"
            + (f"; first failures: {[r.error for r in failed[:3]]}" if failed else ""))
