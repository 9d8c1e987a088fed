"""A minimal OpenAI-compatible server that really loads a safetensors checkpoint onto a GPU.

    python3 benchmarks/swap_server.py --model-path DIR --port PORT [--name NAME]

Used by ``bench_swap_downtime.py``: the point is the start-up, which like a
real model server's is dominated by reading every byte of the weights and
copying them to the GPU. The HTTP server comes up first and answers 503 on
``/health_generate`` and ``/health`` while loading (as SGLang does), 200 once
every tensor is on the GPU. ``/v1/completions`` returns one token computed from
the weights on the GPU (enough for a smoke test). ``/get_server_info`` reports
the server's own timeline: process start, port bound, weights loaded.

Without torch (a CPU dry run of the benchmark), the files are read whole
into memory instead and nothing is copied to a GPU.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time

STATE: dict = {"status": "loading", "bytes": 0, "tensors": 0, "error": None}


def process_started_at() -> float:
    """This process's start (epoch), from /proc: the moment the launcher forked it (10 ms ticks;
    /proc/stat's btime has 1 s resolution, so the boot clock is read instead)."""
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    since_boot = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - since_boot


def load(model: str, device: str) -> None:
    t0 = time.time()
    files = sorted(os.path.join(model, n) for n in os.listdir(model) if n.endswith(".safetensors"))
    try:
        try:
            import torch
            from safetensors.torch import load_file
        except ImportError:
            torch = None  # type: ignore[assignment]
        tensors: dict = {}
        for path in files:
            if torch is not None:
                part = load_file(path, device=device)  # reads every byte, copies it to the GPU
                tensors.update(part)
                STATE["bytes"] += sum(t.numel() * t.element_size() for t in part.values())
            else:
                with open(path, "rb") as f:
                    data = f.read()
                STATE["bytes"] += len(data)
                tensors[path] = data
            STATE["tensors"] = len(tensors)
        if torch is not None:
            torch.cuda.synchronize()
        STATE["weights"] = tensors
        STATE["loaded_at"] = time.time()
        STATE["load_s"] = STATE["loaded_at"] - t0
        STATE["status"] = "ready"
        print(f"loaded {STATE['bytes'] / 1e9:.2f} GB in {STATE['load_s']:.2f} s; ready", flush=True)
    except Exception as exc:  # the server says so and exits: a failed start
        STATE["status"] = "failed"
        STATE["error"] = repr(exc)
        print(f"ERROR loading weights: {exc!r}", flush=True)
        os._exit(1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--name", default="swap-server")
    ap.add_argument("--device", default="cuda:0")
    a = ap.parse_args()
    started = process_started_at()
    from aiohttp import web

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((a.host, a.port))
    bound_at = time.time()
    print(f"{a.name}: port {a.port} bound; loading {a.model_path}", flush=True)

    async def health(_req: web.Request) -> web.Response:
        return web.Response(status=200 if STATE["status"] == "ready" else 503, text=STATE["status"])

    async def models(_req: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": a.model_path, "object": "model"}]})

    async def completions(req: web.Request) -> web.Response:
        if STATE["status"] != "ready":
            return web.json_response({"error": "loading"}, status=503)
        body = await req.json()
        w = next(iter(STATE["weights"].values()))
        value = float(w.flatten()[:8].float().sum()) if hasattr(w, "flatten") else float(w[0])
        return web.json_response({"id": "cmpl-1", "object": "text_completion", "model": body.get("model"),
                                  "choices": [{"index": 0, "text": f" {value:.3f}", "finish_reason": "length"}],
                                  "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

    async def info(_req: web.Request) -> web.Response:
        return web.json_response({"name": a.name, "pid": os.getpid(), "status": STATE["status"],
                                  "process_started_at": started, "port_bound_at": bound_at,
                                  "ready_at": STATE.get("loaded_at"), "load_s": STATE.get("load_s"),
                                  "bytes_loaded": STATE["bytes"], "tensors": STATE["tensors"]})

    async def start_loading(_app: web.Application) -> None:
        threading.Thread(target=load, args=(a.model_path, a.device), daemon=True).start()

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/health_generate", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/get_server_info", info)
    app.on_startup.append(start_loading)
    # a short shutdown: SIGTERM must end it promptly even with a client connection open
    web.run_app(app, sock=sock, print=None, handle_signals=True, shutdown_timeout=1.0)


if __name__ == "__main__":
    sys.exit(main())
