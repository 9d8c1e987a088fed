"""HTTP peers that break a bound (issue 25): a model list nested 100,000 deep or of 20 MB, a stream
whose event line never ends or nests without end, an answer trickled byte by byte. ``bench`` fails
that request or that server with one line, ``up``'s readiness probe and smoke test return within
their time; never a RecursionError, a hang or unbounded memory. A real HTTP server (the standard
library's, in a thread), real requests."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpuslate.units.readiness import MAX_ANSWER_BYTES, http
from helpers import run_cli

MODELS = b'{"object": "list", "data": [{"id": "m"}]}'


class Hostile(BaseHTTPRequestHandler):
    shape = "ok"

    def log_message(self, *args: object) -> None:
        pass

    def _head(self, ctype: str = "application/json") -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.end_headers()

    def do_GET(self) -> None:
        shape = type(self).shape
        self._head()
        if shape == "deep-models":
            self.wfile.write(b"[" * 100_000 + b"]" * 100_000)
        elif shape == "huge-models":
            for _ in range(20):
                self.wfile.write(b" " * (1 << 20))  # 20 MB of valid JSON whitespace, then the list
            self.wfile.write(MODELS)
        elif shape == "trickle":
            t = time.monotonic()
            while time.monotonic() - t < 10:
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.05)
        else:
            self.wfile.write(MODELS)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        shape = type(self).shape
        self._head("text/event-stream")
        if shape == "endless-line":
            self.wfile.write(b"data: {\"choices\": [{\"text\": \"")
            for _ in range(6):
                self.wfile.write(b"x" * (1 << 20))  # an event line of 6 MB, no newline
        elif shape == "deep-event":
            self.wfile.write(b"data: " + b"[" * 50_000 + b"]" * 50_000 + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.fixture
def server() -> Iterator[tuple[str, type[Hostile]]]:
    handler = type("H", (Hostile,), {})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    # gpuslate hanging up on an answer past its bounds is the point: not a traceback of ours
    srv.handle_error = lambda request, client_address: None  # type: ignore[method-assign]
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", handler
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("shape", ["deep-models", "huge-models"])
def test_bench_refuses_a_model_list_past_its_bounds(server, shape):
    url, handler = server
    handler.shape = shape
    r = run_cli("bench", url, "-n", "1", timeout=60)
    assert r.returncode == 6 and "Traceback" not in r.stderr, r.stderr
    assert "lists no model" in r.stderr.splitlines()[0]


@pytest.mark.parametrize("shape,why", [("endless-line", "event line of more than"),
                                       ("deep-event", "nested too deep")])
def test_bench_fails_the_request_of_a_stream_past_its_bounds(server, shape, why):
    url, handler = server
    handler.shape = shape
    r = run_cli("bench", url, "-n", "1", "--output-len", "4", "--json", timeout=60)
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 6, r.stderr  # no request succeeded
    assert why in json.dumps(json.loads(r.stdout)["levels"][0]["errors"]), r.stdout[-1000:]


def test_a_readiness_probe_is_bounded_in_time_and_bytes(server):
    url, handler = server
    handler.shape = "trickle"
    t0 = time.monotonic()
    with pytest.raises(OSError, match="no whole answer within 1 s"):
        http("GET", url + "/health", timeout=1.0)
    assert time.monotonic() - t0 < 3
    handler.shape = "huge-models"
    status, body = http("GET", url + "/v1/models", timeout=10.0)
    assert status == 200 and len(body) == MAX_ANSWER_BYTES + 1  # cut off, never read whole
