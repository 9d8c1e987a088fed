"""Managed units on a real GPU: a small aiohttp server whose worker processes allocate GPU
memory with torch is brought up, swapped for another, and brought down, with the memory
release verified through NVML. Run on the device machine: pytest -m gpu tests/gpu/test_units_real.py
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

#: A stand-in for a model server: workers hold GPU memory (like tensor-parallel ranks),
#: /health_generate is 503 until every worker holds its memory; SIGTERM ends it all.
TORCH_SERVER = r'''
import argparse, asyncio, os, signal, subprocess, sys, time
from aiohttp import web

WORKER = """
import sys, signal, time, torch
rank, nbytes = int(sys.argv[1]), int(sys.argv[2])
dev = rank % torch.cuda.device_count()
x = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{dev}")
x.fill_(1)
torch.cuda.synchronize()
print("ready", flush=True)
signal.sigwait({signal.SIGTERM, signal.SIGINT})
"""

p = argparse.ArgumentParser()
p.add_argument("--port", type=int, required=True)
p.add_argument("--workers", type=int, default=2)
p.add_argument("--memory-gib", type=float, default=2.0)
p.add_argument("--name", default="torch-sim")
a = p.parse_args()
started_at = time.time()
state = {"status": "starting", "ready_at": None, "workers": []}


async def load():
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(r), str(int(a.memory_gib * 2**30))],
                              stdout=subprocess.PIPE, text=True) for r in range(a.workers)]
    state["workers"] = procs
    loop = asyncio.get_running_loop()
    for pr in procs:
        line = await loop.run_in_executor(None, pr.stdout.readline)
        if line.strip() != "ready":
            print("worker failed", file=sys.stderr, flush=True)
            os._exit(1)
    state["status"], state["ready_at"] = "ready", time.time()
    print("The server is fired up and ready to roll!", file=sys.stderr, flush=True)


def gate(ok):
    return web.Response(status=200 if state["status"] == "ready" else 503, text=ok)


async def info(_):
    return web.json_response({"pid": os.getpid(), "status": state["status"], "model": a.name,
                              "started_at": started_at, "ready_at": state["ready_at"],
                              "worker_pids": [w.pid for w in state["workers"]]})


async def models(_):
    if state["status"] != "ready":
        return gate("")
    return web.json_response({"object": "list", "data": [{"id": a.name, "object": "model"}]})


async def complete(_):
    if state["status"] != "ready":
        return gate("")
    return web.json_response({"object": "text_completion", "model": a.name,
                              "choices": [{"index": 0, "text": " x", "finish_reason": "length"}]})


async def main():
    app = web.Application()
    app.router.add_get("/health", lambda r: gate("ok"))
    app.router.add_get("/health_generate", lambda r: gate("ok"))
    app.router.add_get("/v1/models", models)
    app.router.add_get("/get_server_info", info)
    app.router.add_post("/v1/completions", complete)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", a.port).start()
    stop = asyncio.Event()
    for s in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(s, stop.set)
    asyncio.create_task(load())
    await stop.wait()
    for w in state["workers"]:
        w.terminate()
    for w in state["workers"]:
        w.wait()
    await runner.cleanup()


asyncio.run(main())
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_info(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/get_server_info", timeout=5) as r:
        return json.loads(r.read())


@pytest.fixture
def real_units(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.delenv("GPUSLATE_SIM", raising=False)
    monkeypatch.setenv("GPUSLATE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("GPUSLATE_LOCK_DIR", str(tmp_path / "locks"))
    script = tmp_path / "torch_server.py"
    script.write_text(TORCH_SERVER)
    yield script
    from gpuslate.proc.signals import send_signal
    from gpuslate.proc.tree import ProcTable
    from gpuslate.units.unit import load_units
    from helpers import unit_records

    table = ProcTable()
    for unit in load_units(unit_records()):  # only what this test's units started
        for st in unit.members(table):
            send_signal(st.ident, signal.SIGKILL)


def test_up_swap_down_with_torch_workers(real_units: Path) -> None:
    import gpuslate
    from gpuslate.units import UnitSpec

    host = gpuslate.Host.open()
    up, down, swap, list_units = host.up, host.down, host.swap, host.ps

    port = free_port()

    def spec(name: str) -> UnitSpec:
        return UnitSpec(name, command=[sys.executable, str(real_units), "--port", str(port), "--workers", "2",
                                       "--memory-gib", "2", "--name", name],
                        gpus=[0], port=port, engine="sglang", smoke=True, start_timeout=300, grace=10)

    first = up(spec("torch-a"))
    assert first.ok, first.to_json()
    assert first.smoke and first.smoke["ok"] and first.smoke["model"] == "torch-a"
    info_a = server_info(port)
    held = {p.pid: p.used_memory for p in gpuslate.status([0]).gpus[0].processes if p.kind == "compute"}
    assert set(info_a["worker_pids"]) <= set(held), held
    assert all(held[w] >= 2 * 2**30 for w in info_a["worker_pids"])
    a = list_units().get("torch-a")
    assert a.state == "ready" and a.gpu_memory >= 4 * 2**30

    result = swap("torch-a", spec("torch-b"))
    assert result.ok, result.to_json()
    doc = result.to_json()
    print(json.dumps({k: doc[k] for k in ("phases", "total_s", "overhead_s")}, indent=2))
    assert doc["down"]["memory_released"]
    info_b = server_info(port)
    assert info_b["model"] == "torch-b" and not set(info_b["worker_pids"]) & set(info_a["worker_pids"])
    for pid in info_a["worker_pids"]:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split(")")[1].split()[0] == "Z"

    gone = down("torch-b")
    assert gone.ok and gone.report.released, gone.to_json()
    after = gpuslate.status([0]).gpus[0]
    assert not [p for p in after.processes if p.pid in info_b["worker_pids"]]
    assert list_units().get("torch-b").state == "stopped"
