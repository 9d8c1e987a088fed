"""``sim serve --emulate E`` starts and stops as engine E does (its module's Lifecycle), seen from
outside with real processes and real HTTP: when its port takes connections while it loads, its
health routes during the warmup, what SIGTERM does to requests in flight and to new ones, a worker's
death, and ``--drain-seconds`` (slow to drain)."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuslate.engines import BACKENDS
from gpuslate.engines.base import Listening, OnTerm
from gpuslate.gpu.simhost.host import SimHost
from helpers import gpuslate_env, wait_for

pytestmark = pytest.mark.slow

GiB = 1 << 30
READY = "The server is fired up and ready to roll!"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def engine_args(engine: str, port: int, *more: str) -> list[str]:
    head = {"vllm": ["serve", "m"], "sglang": ["--model-path", "m"], "trtllm": ["/m"]}[engine]
    return [*head, "--port", str(port), *more]


class Server:
    """A ``sim serve`` process, its stderr read line by line on a thread."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env=gpuslate_env(env), start_new_session=True)
        self.log: list[str] = []
        self.port = 0
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line.rstrip("\n"))
            m = re.search(r"(?:bound|listening on) http://127\.0\.0\.1:(\d+)", line)
            if m and not self.port:
                self.port = int(m.group(1))

    def saw(self, text: str) -> bool:
        return any(text in line for line in self.log)

    def wait_line(self, text: str, timeout: float = 30) -> None:
        # until the line comes, or its stderr ended (read to its end: the process is gone)
        wait_for(lambda: self.saw(text) or not self._reader.is_alive(), timeout=timeout)
        assert self.saw(text), "\n".join(self.log)

    def get(self, path: str) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", path)
            return conn.getresponse().status
        finally:
            conn.close()

    def post(self, path: str, body: dict) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def refused(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=2).close()
        except ConnectionRefusedError:
            return True
        return False

    def term(self, group: bool = False) -> None:
        (os.killpg if group else os.kill)(self.proc.pid, signal.SIGTERM)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self._reader.join(10)


class Stream:
    """One streaming completion on a thread: its status, its chunks, whether it ended with [DONE]."""

    def __init__(self, port: int, max_tokens: int) -> None:
        self.status: int | None = None
        self.chunks = 0
        self.done = False
        self.error: str | None = None
        self.ended = threading.Event()
        body = {"prompt": "hello", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
        self._thread = threading.Thread(target=self._run, args=(port, body), daemon=True)
        self._thread.start()

    def _run(self, port: int, body: dict) -> None:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            self.status = r.status
            while line := r.readline():
                if line.startswith(b"data:"):
                    self.chunks += 1
                    self.done = self.done or line.strip() == b"data: [DONE]"
                    if b'"error"' in line:
                        self.error = line.decode(errors="replace")
        except (OSError, http.client.HTTPException) as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.ended.set()


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    started: list[Server] = []

    def start(engine: str, *args: str, port: int = 0, sim: tuple[str, ...] = (), host: SimHost | None = None,
              startup: float = 0.0) -> Server:
        port = port or (free_port() if engine == "trtllm" else 0)
        argv = [sys.executable, "-m", "gpuslate", *(["--sim", str(host.root)] if host else []), "sim", "serve",
                "--startup-seconds", str(startup), *(("--workers", "0") if host is None else ("--gpus", "0")),
                "--memory", "1GiB", *sim, "--emulate", engine, "--", *engine_args(engine, port, *args)]
        s = Server(argv)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


def test_the_engines_declare_how_they_start_and_stop():
    """The facts the simulator plays, as read in the engines' sources (their modules cite them)."""
    vllm, sglang, trtllm, sim = (BACKENDS[n].lifecycle for n in ("vllm", "sglang", "trtllm", "sim"))
    assert vllm.listening == trtllm.listening == Listening.BOUND_REFUSING
    assert sglang.listening == Listening.AFTER_LOAD and sglang.warmup_s > 0 and sglang.warmup_tokens > 0
    assert sim.listening == Listening.AT_ONCE
    assert vllm.shutdown.on_term == sim.shutdown.on_term == OnTerm.IMMEDIATE
    assert sglang.shutdown.on_term == OnTerm.DRAIN_SERVING and sglang.shutdown.poll_s
    assert trtllm.shutdown.on_term == OnTerm.DRAIN_CLOSED
    assert all(lc.source for lc in (vllm, sglang, trtllm, sim))


def test_vllm_binds_first_and_refuses_connections_until_it_serves(serve):
    s = serve("vllm", startup=1.5)
    wait_for(lambda: s.port, timeout=30)
    assert s.refused()  # bound, not listening: a connection is refused while it loads
    with socket.socket() as other, pytest.raises(OSError):
        other.bind(("127.0.0.1", s.port))  # and the port is taken
    s.wait_line(READY)
    assert s.get("/health") == 200 and s.get("/v1/models") == 200


def test_sglang_binds_once_loaded_and_its_health_answers_503_while_it_warms_up(serve):
    port = free_port()
    s = serve("sglang", port=port, startup=0.5)
    s.port = port
    s.wait_line("loading:")
    assert s.refused()  # nothing bound while it loads
    s.wait_line("listening on")
    # warming up (its 1 s wait, then an 8-token generation): health 503, generation served
    assert s.get("/health_generate") == 503 and s.get("/health") == 503
    status, _ = s.post("/v1/completions", {"prompt": "hi", "max_tokens": 2})
    assert status == 200 and not s.saw(READY)
    s.wait_line(READY)
    assert s.get("/health_generate") == 200


def test_trtllm_binds_first_then_serves(serve):
    s = serve("trtllm", startup=1.0)
    wait_for(lambda: s.port, timeout=30)
    assert s.refused()
    s.wait_line(READY)
    assert s.get("/health") == 200


SLOW = ("--base-step-ms", "20")  # 50 tokens a second, whatever the batch: a 60-token answer takes over a second


def test_vllm_sigterm_ends_what_is_in_flight_at_once(serve):
    s = serve("vllm", sim=SLOW)
    s.wait_line(READY)
    stream = Stream(s.port, 200)
    wait_for(lambda: stream.chunks > 2, timeout=20)
    t0 = time.monotonic()
    s.term()
    assert stream.ended.wait(10) and not stream.done, (stream.error, s.log)
    assert s.proc.wait(10) == 0 and time.monotonic() - t0 < 3


def test_vllm_drain_mode_refuses_new_requests_and_finishes_those_in_flight(serve):
    s = serve("vllm", "--shutdown-mode", "drain", sim=SLOW)
    s.wait_line(READY)
    stream = Stream(s.port, 60)
    wait_for(lambda: stream.chunks > 2, timeout=20)
    s.term()
    s.wait_line("draining 1 request")
    status, body = s.post("/v1/completions", {"prompt": "hi", "max_tokens": 2})
    assert status == 503 and json.loads(body) == {"error": "Server is unavailable. Please try again later."}
    assert s.get("/health") == 503
    assert stream.ended.wait(20) and stream.done and stream.error is None
    assert s.proc.wait(10) == 0


def test_vllm_drain_timeout_cuts_what_still_runs(serve):
    s = serve("vllm", "--shutdown-mode", "drain", "--shutdown-drain-timeout", "1", sim=SLOW)
    s.wait_line(READY)
    stream = Stream(s.port, 2000)
    wait_for(lambda: stream.chunks > 2, timeout=20)
    t0 = time.monotonic()
    s.term()
    assert stream.ended.wait(20) and not stream.done
    assert s.proc.wait(10) == 0 and 0.9 < time.monotonic() - t0 < 5
    s.wait_line("drain timed out: 1 request still running", timeout=10)


def test_sglang_keeps_serving_through_sigterm_and_goes_at_its_watchdog_tick(serve):
    s = serve("sglang", sim=("--time-scale", "5", "--base-step-ms", "100"))  # its 5 s tick every 1 s
    s.wait_line(READY)
    stream = Stream(s.port, 40)
    wait_for(lambda: stream.chunks > 2, timeout=20)
    s.term()
    s.wait_line("draining 1 request")
    assert s.get("/health") == 503 and s.get("/health_generate") == 503
    status, _ = s.post("/v1/completions", {"prompt": "hi", "max_tokens": 2})
    assert status == 200  # new requests are still served
    assert stream.ended.wait(20) and stream.done and stream.error is None
    assert s.proc.wait(10) == 0


def test_trtllm_closes_its_port_at_sigterm_and_finishes_what_is_in_flight(serve):
    s = serve("trtllm", sim=SLOW)
    s.wait_line(READY)
    stream = Stream(s.port, 60)
    wait_for(lambda: stream.chunks > 2, timeout=20)
    s.term()
    s.wait_line("draining 1 request")
    assert s.refused()
    assert stream.ended.wait(20) and stream.done and stream.error is None
    assert s.proc.wait(10) == 0


def test_a_worker_that_dies_ends_the_sglang_server_and_its_drain(serve, tmp_path):
    """SIGTERM to every process of the server (as gpuslate's stop sends it): its ranks die at once,
    and the engine, which cannot run its requests without them, ends them within its watchdog's look."""
    host = SimHost.init(tmp_path / "h", gpus=1, memory=8 * GiB, release_delay=0.05)
    s = serve("sglang", host=host, sim=SLOW)
    s.wait_line(READY)
    stream = Stream(s.port, 2000)
    wait_for(lambda: stream.chunks > 2, timeout=20)
    t0 = time.monotonic()
    s.term(group=True)
    assert stream.ended.wait(10) and not stream.done
    assert s.proc.wait(10) == 1 and time.monotonic() - t0 < 4
    s.wait_line("is gone: the engine cannot run its requests without it", timeout=10)  # read by the time it exited


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_drain_seconds_makes_it_slow_to_go(serve, engine):
    s = serve(engine, sim=("--drain-seconds", "1.5"))
    s.wait_line(READY)
    t0 = time.monotonic()
    s.term()
    assert s.proc.wait(10) == 0
    assert 1.4 < time.monotonic() - t0 < 6.5
