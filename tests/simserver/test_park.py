"""The emulated engines' park endpoints on real servers: memory leaving and coming back on a simulated
host, the engines' rules, the tokens before and after, and each misbehaviour switched on.

Every server is a real ``gpuslate sim serve`` process started by the test in its own session, spoken
to over real HTTP, and ended by the test (the ``serve`` fixture, also when a test fails); its workers
hold simulated memory that ``status``'s backend reads.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpuslate.gpu.simhost import SimBackend
from gpuslate.gpu.simhost.holder import split
from gpuslate.gpu.simhost.host import SimHost
from gpuslate.simserver.parkmodel import REGIONS
from helpers import GiB, gpuslate_env, wait_for

pytestmark = pytest.mark.slow

PROMPT = {"prompt": "the same question", "max_tokens": 12, "temperature": 0}
REGION = dict(split(20 * GiB, REGIONS))  # what each of a worker's regions holds on its GPU


class Served:
    """A running server: its URL, its log, HTTP helpers."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.url = ""
        self.log: list[str] = []
        self.ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line.rstrip("\n"))
            if "listening on " in line and not self.url:
                self.url = line.split("listening on ")[1].split()[0]
            if "ready to roll" in line:
                self.ready.set()
        self.ready.set()

    def exit_code(self, timeout: float = 30) -> int:
        """The server's exit status, once its whole log is read (the process may end before the reader
        has its last lines)."""
        code = self.proc.wait(timeout)
        self._reader.join(timeout)
        return code

    def call(self, method: str, path: str, body: Any = None, timeout: float = 30) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                raw = r.read()
                return r.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            return exc.code, json.loads(raw) if raw else None

    def text(self) -> str:
        status, doc = self.call("POST", "/v1/completions", PROMPT)
        assert status == 200, doc
        return doc["choices"][0]["text"]

    def info(self) -> dict[str, Any]:
        return self.call("GET", "/get_server_info")[1]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._reader.join(10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


@pytest.fixture
def host(tmp_path) -> SimHost:
    return SimHost.init(tmp_path / "h", gpus=2, memory=96 * GiB, release_delay=0.05)


@pytest.fixture
def serve(host: SimHost) -> Iterator[Callable[..., Served]]:
    started: list[Served] = []

    def start(engine: str, *engine_args: str, sim: tuple[str, ...] = (), env: dict[str, str] | None = None,
              gpus: str = "0,1") -> Served:
        port = ["--port", "0"]
        argv = [sys.executable, "-m", "gpuslate", "--sim", str(host.root), "sim", "serve", "--startup-seconds", "0",
                "--time-scale", "20", "--gpus", gpus, "--memory", "20GiB", *sim, "--emulate", engine, "--",
                *(["serve", "m"] if engine == "vllm" else ["--model-path", "m"]), *port, *engine_args]
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                env=gpuslate_env(env), start_new_session=True)
        s = Served(proc)
        started.append(s)
        assert s.ready.wait(30) and proc.poll() is None, "\n".join(s.log)
        return s

    yield start
    for s in started:
        s.stop()


def used(host: SimHost) -> list[int]:
    return [r.memory.used for r in SimBackend(host.root).read(None, full=False)]


def in_background(s: Served, path: str, body: Any) -> tuple[threading.Thread, list[Any]]:
    """Send a request from a thread; ``out`` gets its (status, document), or the error of a server that
    went away under it."""
    out: list[Any] = []

    def send() -> None:
        try:
            out.append(s.call("POST", path, body, timeout=60))
        except (OSError, http.client.HTTPException) as exc:  # the connection dropped: the server died
            out.append(exc)

    t = threading.Thread(target=send, daemon=True)
    t.start()
    return t, out


def in_flight(s: Served, body: dict[str, Any]) -> tuple[threading.Thread, list[Any]]:
    t, out = in_background(s, "/v1/completions", body)
    wait_for(lambda: s.info()["counters"]["requests_submitted"] >= 2)  # the one sent (and the reference)
    return t, out


DEV = {"VLLM_SERVER_DEV_MODE": "1"}


def test_vllm_level_1_offloads_the_weights_and_wakes_with_the_same_tokens(host: SimHost, serve) -> None:
    s = serve("vllm", "--enable-sleep-mode", env=DEV)
    reference = s.text()
    assert used(host) == [20 * GiB, 20 * GiB]
    _, free_before = host.host_memory()
    assert s.call("POST", "/sleep?level=1") == (200, None)
    assert s.call("GET", "/is_sleeping") == (200, {"is_sleeping": True})
    residue = REGION["context"] + REGION["cuda_graph"]  # the CUDA context and graphs stay
    assert used(host) == [residue, residue]
    assert host.host_memory()[1] == free_before - 2 * REGION["weights"]  # the weights, in host memory
    t, out = in_flight(s, PROMPT)  # a request while asleep waits in the paused scheduler
    assert s.info()["counters"]["waiting"] == 1
    assert s.call("POST", "/wake_up") == (200, None)
    t.join(30)
    assert out[0][0] == 200 and out[0][1]["choices"][0]["text"] == reference
    assert used(host) == [20 * GiB, 20 * GiB] and host.host_memory()[1] == free_before
    assert s.call("GET", "/is_sleeping") == (200, {"is_sleeping": False})
    assert s.text() == reference


def test_vllm_level_2_needs_reload_weights_before_the_same_tokens(host: SimHost, serve) -> None:
    s = serve("vllm", "--enable-sleep-mode", env=DEV)
    reference = s.text()
    _, free_before = host.host_memory()
    assert s.call("POST", "/sleep?level=2")[0] == 200
    assert host.host_memory()[1] == free_before  # discarded, not offloaded
    assert s.call("POST", "/wake_up?tags=weights")[0] == 200
    assert s.call("GET", "/is_sleeping")[1] == {"is_sleeping": True}  # the KV cache still sleeps
    assert s.call("POST", "/collective_rpc", {"method": "reload_weights"}) == (200, {"results": [None, None]})
    assert s.call("POST", "/wake_up?tags=kv_cache")[0] == 200
    assert used(host) == [20 * GiB, 20 * GiB] and s.text() == reference
    # woken whole without the reload: remapped empty, one token repeated
    assert s.call("POST", "/sleep?level=2")[0] == 200 and s.call("POST", "/wake_up")[0] == 200
    assert s.text() != reference and len(set(s.text().split())) == 1


def test_vllm_endpoints_need_dev_mode_and_free_nothing_without_sleep_mode(host: SimHost, serve) -> None:
    s = serve("vllm", "--enable-sleep-mode")
    assert s.call("POST", "/sleep")[0] == 404
    t = serve("vllm", env=DEV, gpus="0")  # no --enable-sleep-mode: the pools track nothing
    assert t.call("POST", "/sleep?level=1")[0] == 200 and t.call("GET", "/is_sleeping")[1] == {"is_sleeping": True}
    assert used(host)[0] == 40 * GiB
    u = serve("vllm", "--enable-sleep-mode", env={**DEV, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
              gpus="1")  # vLLM PR #11743
    assert u.call("POST", "/sleep?level=1")[0] == 200
    assert used(host)[1] == 40 * GiB


def test_vllm_sleep_aborts_requests_in_flight_by_default(host: SimHost, serve) -> None:
    s = serve("vllm", "--enable-sleep-mode", env=DEV, sim=("--time-scale", "1"))
    s.text()
    t, out = in_flight(s, {"prompt": "long", "max_tokens": 30000, "ignore_eos": True})
    assert s.call("POST", "/sleep")[0] == 200
    t.join(30)
    assert out[0][0] == 200 and out[0][1]["choices"][0]["finish_reason"] == "abort"


def test_crash_in_flight_answers_200_and_the_engine_dies(host: SimHost, serve) -> None:
    s = serve("vllm", "--enable-sleep-mode", env=DEV, sim=("--time-scale", "1", "--misbehave", "crash-in-flight"))
    s.text()
    in_flight(s, {"prompt": "long", "max_tokens": 30000, "ignore_eos": True})
    assert s.call("POST", "/sleep")[0] == 200  # vLLM #28714: the sleep says it worked
    assert s.exit_code() == 1
    assert any("illegal memory access" in line for line in s.log)
    wait_for(lambda: used(host) == [0, 0])  # its workers went with it


def test_sglang_releases_not_offloads_and_needs_update_weights_from_disk(host: SimHost, serve) -> None:
    s = serve("sglang", "--enable-memory-saver")
    reference = s.text()
    _, free_before = host.host_memory()
    assert s.call("POST", "/release_memory_occupation", {}) == (200, None)
    context = REGION["context"]
    assert used(host) == [context, context] and host.host_memory()[1] == free_before
    assert s.call("POST", "/resume_memory_occupation", {}) == (200, None)
    assert used(host) == [20 * GiB, 20 * GiB]
    assert s.text() != reference  # released, not offloaded (#19442): the same prompt, other tokens
    assert s.call("POST", "/update_weights_from_disk", {"model_path": "m"}) == (
        200, {"success": True, "message": "Succeeded to update model weights."})
    assert s.text() == reference


def test_sglang_with_cpu_backup_keeps_the_weights_in_host_memory(host: SimHost, serve) -> None:
    s = serve("sglang", "--enable-memory-saver", "--enable-weights-cpu-backup")
    reference = s.text()
    _, free_before = host.host_memory()
    assert s.call("POST", "/release_memory_occupation", {"tags": ["weights"]})[0] == 200
    assert host.host_memory()[1] == free_before - 2 * REGION["weights"]
    assert s.call("POST", "/resume_memory_occupation", {"tags": ["weights"]})[0] == 200
    assert s.text() == reference and host.host_memory()[1] == free_before


def test_sglang_without_memory_saver_frees_nothing(host: SimHost, serve) -> None:
    s = serve("sglang")
    assert s.call("POST", "/release_memory_occupation", {})[0] == 200
    assert used(host) == [20 * GiB, 20 * GiB]


@pytest.mark.parametrize("call", ["release in flight", "resume unreleased"])
def test_sglang_dies_on_its_assertion_and_its_key_error(host: SimHost, serve, call: str) -> None:
    s = serve("sglang", "--enable-memory-saver", sim=("--time-scale", "1"))
    if call == "release in flight":
        s.text()
        in_flight(s, {"prompt": "long", "max_tokens": 30000, "ignore_eos": True})
        path, want = "/release_memory_occupation", "AssertionError: release_memory_occupation should be called only"
    else:
        path, want = "/resume_memory_occupation", "KeyError: 'kv_cache'"
    t, out = in_background(s, path, {})
    assert s.exit_code() == 1
    t.join(30)
    assert isinstance(out[0], (OSError, http.client.HTTPException)), out  # no answer: the server died under it
    assert any(want in line for line in s.log), s.log
    wait_for(lambda: used(host) == [0, 0])


def test_leak_early_return_and_wrong_weights(host: SimHost, serve) -> None:
    leak = serve("vllm", "--enable-sleep-mode", env=DEV, sim=("--misbehave", "leak-after-sleep"), gpus="0")
    assert leak.call("POST", "/sleep?level=1")[0] == 200
    assert used(host)[0] == 20 * GiB - REGION["weights"]  # the KV cache stayed (#32714)
    leak.stop()
    wait_for(lambda: used(host)[0] == 0)
    early = serve("sglang", "--enable-memory-saver", sim=("--misbehave", "early-return"), gpus="0")
    assert early.call("POST", "/release_memory_occupation", {})[0] == 200
    assert used(host)[0] == 20 * GiB  # answered before the memory left ...
    wait_for(lambda: used(host)[0] == REGION["context"])  # ... which it does later
    wrong = serve("vllm", "--enable-sleep-mode", env=DEV, sim=("--misbehave", "wrong-weights"), gpus="1")
    reference = wrong.text()
    assert wrong.call("POST", "/sleep?level=1")[0] == 200 and wrong.call("POST", "/wake_up")[0] == 200
    assert used(host)[1] == 20 * GiB and wrong.text() != reference


def test_eagle3_level_2_with_cuda_graphs_dies_at_the_first_generation(host: SimHost, serve) -> None:
    spec = json.dumps({"method": "eagle3", "model": "d", "num_speculative_tokens": 3})
    s = serve("vllm", "--enable-sleep-mode", "--speculative-config", spec, env=DEV)
    for path in ("/sleep?level=2", "/wake_up"):
        assert s.call("POST", path)[0] == 200
    assert s.call("POST", "/collective_rpc", {"method": "reload_weights"})[0] == 200
    assert s.call("POST", "/v1/completions", PROMPT)[0] == 500  # vLLM #55013
    assert s.proc.wait(30) == 1
    eager = serve("vllm", "--enable-sleep-mode", "--enforce-eager", "--speculative-config", spec, env=DEV)
    reference = eager.text()
    for path in ("/sleep?level=2", "/wake_up"):
        assert eager.call("POST", path)[0] == 200
    assert eager.call("POST", "/collective_rpc", {"method": "reload_weights"})[0] == 200
    assert eager.text() == reference


def test_a_driver_checkpoint_of_a_one_worker_server(host: SimHost, serve) -> None:
    """Any server parks by the driver's checkpoint, the engine unaware: it stalls while locked, its
    memory leaves, and it answers the same after restore and unlock."""
    s = serve("vllm", gpus="0")
    reference = s.text()
    (worker,) = s.info()["worker_pids"]
    be = SimBackend(host.root)
    be.checkpoint_lock(worker)
    wait_for(lambda: s.info()["park"]["gpu_locked"])  # the server sees it (it looks every 50 ms)
    t, out = in_flight(s, PROMPT)  # its GPU work waits for the unlock
    assert s.info()["counters"]["requests_finished"] == 1 and not out
    be.checkpoint(worker)
    assert used(host)[0] == 0
    assert not out and s.info()["counters"]["requests_finished"] == 1  # still waiting, checkpointed
    be.checkpoint_restore(worker)
    be.checkpoint_unlock(worker)
    t.join(30)
    assert out[0][1]["choices"][0]["text"] == reference and used(host)[0] == 20 * GiB


def test_several_workers_share_memory_the_checkpoint_refuses(host: SimHost, serve) -> None:
    s = serve("vllm")
    be = SimBackend(host.root)
    worker = s.info()["worker_pids"][0]
    be.checkpoint_lock(worker)
    with pytest.raises(Exception, match="IPC"):
        be.checkpoint(worker)
