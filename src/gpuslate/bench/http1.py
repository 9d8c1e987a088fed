"""The streamed request's own HTTP/1.1 connections, where the ``fast`` extra installed httptools.

A streamed completion is the load generator's hot path: at concurrency 64 every request brings some
70 server-sent events, and through aiohttp each costs a future, a task switch and a dozen Python calls
of its ``StreamReader`` before gpuslate sees the bytes (about two thirds of the client's CPU per
request, benchmarks/RESULTS.md). Here each connection is an asyncio ``Protocol`` whose bytes go
through httptools (the llhttp parser, uvicorn's) straight into :class:`~.client.StreamParser`, stamped
in ``data_received``: no task wakes until the stream has ended. What it does not do is aiohttp's,
which serves everything else (the model probe, server facts, whole responses), and the streamed
request too where httptools is not installed: the figures are the same either way.

Connections are pooled (the plan's default convention, vLLM's shared keep-alive session): each one the
server let live waits for the next request. ``--connection per-request`` stays on aiohttp, as SGLang's
client does (see :func:`~.client.streaming_connections`). Every byte is bounded: the
status line and headers (:data:`MAX_HEAD_BYTES`), an error body (64 KiB read), an event line
(:data:`~.client.MAX_EVENT_BYTES`); malformed HTTP fails the request, never the run.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import httptools

from .. import __version__

MAX_HEAD_BYTES = 64 << 10  # status line and headers
MAX_ERROR_BODY = 64 << 10  # of a non-200 answer, read for its message


class HttpFailure(Exception):
    """A request that got no whole answer: ``message`` is what the level's errors group it by
    (the prefixes of :data:`~.client.CONNECTION_ERRORS` where the server is not there)."""


class _Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection carrying one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.lost = False
        self.park: list[_Connection] | None = None  # the pool it joins once its answer's last byte is in
        self._reset(None)

    def _reset(self, sink: Callable[[float, bytes], bool] | None) -> None:
        self.sink = sink  # a 200 answer's body: (arrival, bytes) -> True once the stream is over
        self.waiter: asyncio.Future[None] | None = None
        self.status = 0
        self.head_bytes = 0
        self.error_body = bytearray()
        self.complete = False  # the whole HTTP message arrived
        self.keep_alive = False  # and the server let the connection live
        self.ended = False  # on_body said the stream is over: the request is done
        self.headers_seen = False
        self.now = 0.0

    # asyncio's side
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.now = time.perf_counter()
        if self.waiter is None and self.park is None:  # bytes nobody asked for: not reusable
            self.lost = True
            if self.transport is not None:
                self.transport.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:  # a callback's own error is its context
            cause = exc.__context__
            self._fail(cause if isinstance(cause, HttpFailure) else HttpFailure(
                f"malformed response: {cause if isinstance(cause, ValueError) else exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.waiter is not None and not self.waiter.done():
            self._fail(HttpFailure(f"response cut short: {exc or 'connection closed'}" if self.headers_seen
                                   else "server disconnected"))

    # httptools' side
    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_bytes += len(name) + len(value) + 4
        if self.head_bytes > MAX_HEAD_BYTES:
            raise HttpFailure(f"malformed response: headers of more than {MAX_HEAD_BYTES} bytes")

    def on_headers_complete(self) -> None:
        self.headers_seen = True
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if self.status != 200:
            room = MAX_ERROR_BODY - len(self.error_body)
            self.error_body += body[:room]
            if len(body) >= room:
                self._done()  # enough of an error message: the rest is not read
            return
        if not self.ended and self.sink is not None and self.sink(self.now, body):
            self.ended = True
            self._done()

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()  # llhttp's answer for this message, read while it is
        self._done()
        if self.park is not None and self.reusable:
            self.park.append(self)  # [DONE] came before the end of the HTTP message: idle now
        self.park = None

    def _done(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _fail(self, exc: Exception) -> None:
        self.lost = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)
        if self.transport is not None:
            self.transport.abort()

    @property
    def reusable(self) -> bool:
        return self.complete and self.keep_alive and not self.lost \
            and self.transport is not None and not self.transport.is_closing()


class Http1:
    """Streamed POSTs to one server over pooled keep-alive connections (see the module's doc)."""

    def __init__(self, base: str) -> None:
        parts = urlsplit(base)
        self.host = parts.hostname or "127.0.0.1"
        self.tls = parts.scheme == "https"
        self.port = parts.port or (443 if self.tls else 80)
        self.netloc = parts.netloc
        self.prefix = parts.path
        self.idle: list[_Connection] = []
        self._ssl: ssl.SSLContext | None = ssl.create_default_context() if self.tls else None

    def request_head(self, path: str, headers: dict[str, str], length: int) -> bytes:
        """The request line and headers of a POST with a body of ``length`` bytes (the values are one
        line each: the plan refused any with CR, LF or NUL)."""
        given = {k.lower() for k in headers}
        lines = [f"POST {self.prefix}{path} HTTP/1.1"]
        lines += [f"{k}: {v}" for k, v in (("Host", self.netloc), ("User-Agent", f"gpuslate/{__version__}"),
                                           ("Accept", "*/*")) if k.lower() not in given]  # --header wins
        lines.append(f"Content-Length: {length}")
        lines += [f"{k}: {v}" for k, v in headers.items() if k.lower() not in ("content-length", "connection")]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8")

    async def _connect(self) -> _Connection:
        while self.idle:
            conn = self.idle.pop()
            if not conn.lost and conn.transport is not None and not conn.transport.is_closing():
                return conn
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(_Connection, self.host, self.port, ssl=self._ssl,
                                                   server_hostname=self.host if self.tls else None)
        except OSError as exc:
            why = "connection refused" if isinstance(exc, ConnectionRefusedError) else (
                exc.strerror or str(exc) or type(exc).__name__)
            raise HttpFailure(f"cannot connect: {why}") from None
        return conn

    async def post(self, head: bytes, body: bytes, sink: Callable[[float, bytes], bool],
                   timeout: float) -> tuple[int, bytes]:
        """Send one request; feed a 200 answer's body to ``sink`` as it arrives until it returns True
        or the message ends. (status, the first 64 KiB of a non-200 answer's body). Raises
        :class:`HttpFailure`, or ``asyncio.TimeoutError`` past ``timeout`` seconds (connecting
        included: a timer cancels the task, as ``asyncio.timeout`` does from Python 3.11, without a
        task of its own per request); a cancelled or timed-out request aborts its connection."""
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        expired: list[bool] = []

        def expire() -> None:
            expired.append(True)
            task.cancel()

        timer = loop.call_later(timeout, expire)
        try:
            return await self._exchange(head + body, sink)
        except asyncio.CancelledError:
            if expired:
                raise asyncio.TimeoutError from None
            raise
        finally:
            timer.cancel()

    async def _exchange(self, request: bytes, sink: Callable[[float, bytes], bool]) -> tuple[int, bytes]:
        conn = await self._connect()
        conn._reset(sink)
        waiter = conn.waiter = asyncio.get_running_loop().create_future()
        assert conn.transport is not None
        try:
            conn.transport.write(request)
            await waiter
        finally:
            conn.waiter = None
            if conn.reusable:
                self.idle.append(conn)
            elif conn.ended and conn.status == 200 and not conn.lost:
                conn.park = self.idle  # the stream is over, the message's last chunk still to come
            elif conn.transport is not None:
                if conn.complete or conn.lost:
                    conn.transport.close()
                else:
                    conn.transport.abort()  # mid-answer: the server sees the client go
        return conn.status, bytes(conn.error_body)

    def close(self) -> None:
        for conn in self.idle:
            if conn.transport is not None:
                conn.transport.close()
        self.idle.clear()
