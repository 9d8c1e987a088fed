"""``gpuslate sim serve``: a simulated OpenAI-compatible inference server.

It stands in for SGLang/vLLM on machines without GPUs: it binds its port at
once, answers 503 while "loading", logs SGLang's readiness line, and then
generates filler text at the speed the performance model
(:mod:`gpuslate.simserver.perfmodel`) gives for the current batch. The endpoints
and the model are documented in ``docs/sim-server.md``.

With ``--emulate ENGINE`` it starts and stops as that engine does, as its module
declares it (:class:`gpuslate.engines.base.Lifecycle`): when its port takes
connections while it loads, how long its health routes answer 503 after that,
what SIGTERM does to the requests in flight and to new ones, and whether the
death of a worker ends the server.
"""

from __future__ import annotations

import asyncio
import errno
import hmac
import json
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from typing import Any

from aiohttp import web

from .. import __version__
from ..engines import engine
from ..engines.base import Listening, OnTerm
from ..engines.sim import ENGINE as SIM
from ..errors import UsageError
from .openai_api import (
    BadRequest,
    GenerationSpec,
    Kind,
    ResponseBuilder,
    error_body,
    filler_text,
    http_error_body,
    model_not_found_body,
    parse_request,
    requested_model,
)
from .park import Memory, Parking
from .scheduler import BatchScheduler, SchedulerStopped, SimRequest

# Re-exported: the CLI wires `sim serve` through this module.
from .serverconfig import ServerConfig, add_arguments, config_from_args

__all__ = [
    "READY_LINE", "ServerConfig", "SimServer", "add_arguments", "config_from_args",
    "create_app", "run_server", "serving",
]

LOG_PREFIX = "[sim-serve]"
READY_LINE = "The server is fired up and ready to roll!"  # SGLang's, verbatim
HEALTH_GENERATE_TIMEOUT = 20.0  # seconds, like SGLang's health_generate
VERSION_PATH = "/version"
WATCH_FLOOR_S = 0.02  # the shortest look at the workers (an engine that sees a death at once)

Log = Callable[[str], None]
#: the pid of a worker that died (one, None: all live); never reaps it
DeadWorker = Callable[[], "int | None"]


def _stderr_log(line: str) -> None:
    # Looked up per call so test capture and redirected stderr both work.
    print(line, file=sys.stderr, flush=True)


class SimServer:
    """State and HTTP handlers of one simulated server."""

    def __init__(self, config: ServerConfig, *, worker_pids: Sequence[int] = (),
                 log: Log | None = None, memory: Memory | None = None,
                 gpu_locked: Callable[[], bool] | None = None, dead_worker: DeadWorker | None = None) -> None:
        self.config = config
        self._dead_worker = dead_worker
        self._t_start = time.monotonic()
        self.close_port: Callable[[], Awaitable[None]] | None = None  # set by serving(): stop listening
        self.worker_pids = list(worker_pids)
        self._log_line = log or _stderr_log
        self.scheduler = BatchScheduler(
            config.perf, mode=config.mode, spec_disable_threshold=config.spec_disable_threshold,
            max_running_requests=config.max_running_requests, time_scale=config.time_scale)
        self.status = "starting"  # -> "ready" | "failed"
        self.started_at = time.time()
        self.ready_at: float | None = None
        self.startup_done = asyncio.Event()
        self.url = ""
        self.lifecycle = config.lifecycle
        self.listening = asyncio.Event()  # its port takes connections
        self.open_port: Callable[[], Awaitable[None]] | None = None  # set by serving(): listen now
        self.warming = False  # listening, serving requests, its health routes still 503 (its warmup)
        self.stopping: OnTerm | None = None  # SIGTERM taken: what it does about it
        self.in_flight = 0  # generation requests being answered (streams until their last byte)
        self._idle = asyncio.Event()
        self._idle.set()
        self._tasks: list[asyncio.Task[None]] = []
        self.crashed = asyncio.Event()  # the engine died (a fault the simulator plays): the server exits 1
        self.parking = Parking(self, memory, gpu_locked)

    def crash(self, lines: Sequence[str]) -> None:
        """Die as an engine whose GPU work faulted: the lines logged, the server gone (exit 1)."""
        for line in lines:
            self._log_line(line)
        self.log("ERROR the engine died; exiting with code 1")
        self.status = "failed"
        self.crashed.set()

    def log(self, message: str) -> None:
        self._log_line(f"{LOG_PREFIX} {message}")

    def scaled(self, seconds: float) -> float:
        return seconds / self.config.time_scale

    # -- lifecycle ---------------------------------------------------------

    async def _on_startup(self, app: web.Application) -> None:
        self.started_at = time.time()
        self._t_start = time.monotonic()
        self._tasks = [asyncio.create_task(self.scheduler.run()), asyncio.create_task(self._load())]
        if self._dead_worker is not None and self.lifecycle.worker_watch_s is not None:
            self._tasks.append(asyncio.create_task(self._watch_workers(self._dead_worker)))
        self.parking.start()

    async def _watch_workers(self, dead_worker: DeadWorker) -> None:
        """Its engine's look at its worker processes: one that died ends the whole server and the
        requests in it (its ranks cannot finish them), as soon as the engine sees it."""
        assert self.lifecycle.worker_watch_s is not None
        every = max(WATCH_FLOOR_S, self.scaled(self.lifecycle.worker_watch_s))
        while not self.crashed.is_set():
            await asyncio.sleep(every)
            pid = dead_worker()
            if pid is not None:
                self.crash([f"{LOG_PREFIX} ERROR a worker process (pid {pid}) is gone: the engine cannot run its "
                            "requests without it and ends them, and itself"])
                return

    async def stop(self, t0: float) -> None:
        """SIGTERM (taken at monotonic ``t0``), once it listens: do what its engine does before it
        exits (:class:`~gpuslate.engines.base.Shutdown`), for at least ``drain_seconds``; return
        when it may exit: leaving :func:`serving` then ends what still runs and closes its port."""
        sd = self.config.shutdown
        floor = self.scaled(self.config.drain_seconds)
        if not sd.drains or not self.listening.is_set():
            return
        self.stopping = sd.on_term
        if sd.on_term == OnTerm.DRAIN_CLOSED and self.close_port is not None:
            await self.close_port()  # new connections are refused from now on
        bound = None if sd.timeout_s is None else t0 + max(self.scaled(sd.timeout_s), floor)
        poll = self.scaled(sd.poll_s) if sd.poll_s else None
        self.log(f"{sd.on_term}: draining {self.in_flight} request{'s' if self.in_flight != 1 else ''} in flight"
                 + (f", for at most {self.scaled(sd.timeout_s):g} s" if sd.timeout_s is not None else ""))
        while True:
            now = time.monotonic()
            if bound is not None and now >= bound:
                self.log(f"drain timed out: {self.in_flight} request{'s' if self.in_flight != 1 else ''} still "
                         "running, ended now")
                return
            if not self.in_flight and now - t0 >= floor and poll is None:
                return
            if poll is not None:  # it looks only at its ticks, counted from its start
                ticks = int((now - self._t_start) / poll) + 1
                wake = self._t_start + ticks * poll
                await asyncio.sleep(max(0.0, min(wake, bound or wake) - now))
                now = time.monotonic()
                if not self.in_flight and now - t0 >= floor and (bound is None or now < bound):
                    return
                continue
            until = [t0 + floor] if now - t0 < floor else []
            if bound is not None:
                until.append(bound)
            timeout = max(0.0, min(until) - now) if until else None
            if self.in_flight:
                with suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._idle.wait(), timeout)
            else:
                await asyncio.sleep(timeout or 0.0)

    async def _on_shutdown(self, app: web.Application) -> None:
        # Before aiohttp waits for open handlers: stopping the scheduler wakes them.
        await self.parking.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with suppress(asyncio.CancelledError):
                await task

    async def _load(self) -> None:
        c = self.config
        total = c.startup_seconds / c.time_scale
        phases = (
            # one rank per worker holding a GPU, as a tensor-parallel server starts one per GPU
            (0.10, f"initializing distributed environment (tp={max(1, len(self.worker_pids))}, simulated)"),
            (0.50, f"loading weights of {c.model} ..."),
            (0.25, "capturing cuda graphs (simulated) ..."),
            (0.15, "warming up ..."),
        )
        for share, message in phases:
            self.log(message)
            if c.fail_startup and message.startswith("loading weights"):
                await asyncio.sleep(total * share / 2)
                self._crash()
                return
            await asyncio.sleep(total * share)
        if not self.listening.is_set():  # its engine listens only once loaded
            assert self.open_port is not None
            try:
                await self.open_port()
            except OSError as exc:
                self.log(f"ERROR: cannot listen on {c.host}:{c.port}: {exc.strerror or exc}")
                self.status = "failed"
                self.startup_done.set()
                return
            self.log("Application startup complete.")  # uvicorn's, once it serves
            await self._warm_up()
        else:
            self.log("Application startup complete.")  # vLLM's (uvicorn's) readiness line
        self.status = "ready"
        self.warming = False
        self.ready_at = time.time()
        self.log(READY_LINE)
        self.startup_done.set()

    async def _warm_up(self) -> None:
        """The engine's warmup once it listens: a wait, then a real generation through the
        scheduler; its health routes answer 503 meanwhile, its other routes serve."""
        lc = self.lifecycle
        if not lc.warmup_s and not lc.warmup_tokens:
            return
        self.warming = True
        await asyncio.sleep(self.scaled(lc.warmup_s))
        if lc.warmup_tokens:
            req = self.scheduler.submit(prompt_tokens=1, max_tokens=lc.warmup_tokens)
            try:
                while await req.next_tokens() is not None:
                    pass
            except SchedulerStopped:
                pass
            finally:
                self.scheduler.cancel(req)

    def _crash(self) -> None:
        # Shaped like a real load failure so log scrapers and humans see the usual thing.
        for line in (
            "Traceback (most recent call last):",
            '  File "sglang/srt/model_executor/model_runner.py", line 412, in load_model',
            "    self.model = get_model(model_config=self.model_config, load_config=self.load_config)",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
            "capacity of 79.19 GiB of which 1.06 GiB is free. (simulated by --fail-startup)",
        ):
            self._log_line(line)
        self.log("ERROR: scheduler process died during startup; exiting with code 1")
        self.status = "failed"
        self.startup_done.set()

    # -- handlers ----------------------------------------------------------

    def _not_ready(self, request: web.Request) -> web.Response | None:
        """503 where its engine answers 503 now: while it loads or warms up (its health routes), while
        it drains (every route, or its health routes, as its engine does); None: serve it."""
        health = request.path in self.lifecycle.health_paths
        if self.stopping == OnTerm.DRAIN_REFUSING:
            return web.json_response({"error": self.config.shutdown.refusal}, status=503)
        if self.stopping is not None and health:
            return web.Response(status=503)
        if self.status == "ready" or (self.warming and not health):
            return None
        msg = "the server is starting up" if self.status == "starting" else "the server failed to start"
        return web.json_response(error_body(msg, type_="service_unavailable", code=503), status=503)

    async def health(self, request: web.Request) -> web.Response:
        return self._not_ready(request) or web.Response(status=200)

    async def health_generate(self, request: web.Request) -> web.Response:
        if (resp := self._not_ready(request)) is not None:
            return resp
        if (resp := self._faulted()) is not None:
            return resp
        req = self.scheduler.submit(prompt_tokens=1, max_tokens=1)

        async def drain() -> None:
            while await req.next_tokens() is not None:
                pass

        try:
            await asyncio.wait_for(drain(), HEALTH_GENERATE_TIMEOUT)
        except (asyncio.TimeoutError, SchedulerStopped):
            return web.Response(status=503)
        finally:
            self.scheduler.cancel(req)
        return web.Response(status=200)

    def _faulted(self) -> web.Response | None:
        """A generation that would fault on the GPU now (parking.generate_fault): the engine dies."""
        fault = self.parking.generate_fault()
        if fault is None:
            return None
        self.crash([fault])
        return web.json_response(error_body(fault, type_="server_error", code=500), status=500)

    def _model_card(self) -> dict[str, Any]:
        c = self.config
        played = engine(c.emulate) if c.emulate else None  # an emulated engine says what its /v1/models says
        owned = played.owned_by if played is not None and played.owned_by else SIM.owned_by
        return {"id": c.model, "object": "model", "created": int(self.started_at),
                "owned_by": owned, "root": c.model, "max_model_len": c.context_length}

    async def models(self, request: web.Request) -> web.Response:
        if (resp := self._not_ready(request)) is not None:
            return resp
        return web.json_response({"object": "list", "data": [self._model_card()]})

    async def model(self, request: web.Request) -> web.Response:
        """``GET /v1/models/{id}`` (the OpenAI SDK's ``models.retrieve``)."""
        if (resp := self._not_ready(request)) is not None:
            return resp
        model = request.match_info["model"]
        if model != self.config.model:
            return web.json_response(model_not_found_body(model), status=404)
        return web.json_response(self._model_card())

    async def version(self, request: web.Request) -> web.Response:
        """``GET /version`` (with --emulate, for an engine that has it): ``{"version": ...}``."""
        if (resp := self._not_ready(request)) is not None:
            return resp
        return web.json_response({"version": self.config.engine_version or __version__})

    async def server_info(self, request: web.Request) -> web.Response:
        c = self.config
        counters = self.scheduler.snapshot()
        # internal_states mirrors SGLang, whose clients read the accept length there.
        internal = {"avg_spec_accept_length": counters["avg_spec_accept_length"],
                    "last_gen_throughput": None}
        if "speculative_num_steps" in c.engine_info:
            internal["speculative_num_steps"] = c.engine_info.get("speculative_num_steps")
        played = engine(c.emulate) if c.emulate else None
        emulated = {} if played is None else {
            **c.engine_info, "emulates": c.emulate, "engine_version": c.engine_version,
            # an engine without GET /version reports its version here (SGLang's server info)
            **({"version": c.engine_version} if VERSION_PATH not in played.probes else {})}
        return web.json_response({
            "simulated": True, "status": self.status, "model": c.model, "served_model_name": c.model,
            "mode": c.mode, "spec_disable_threshold": c.spec_disable_threshold, "switch_ms": c.perf.switch_ms,
            "accept_length": c.perf.accept_length, "time_scale": c.time_scale,
            "max_running_requests": c.max_running_requests, "context_length": c.context_length,
            "eos_after_tokens": c.eos_after_tokens, "startup_seconds": c.startup_seconds,
            "perf": c.perf.as_dict(), "pid": os.getpid(), "worker_pids": self.worker_pids,
            "started_at": self.started_at, "ready_at": self.ready_at,
            "counters": counters, "internal_states": [internal], "park": self.parking.info(),
            "model_path": c.model,
            "speculative_algorithm": "EAGLE3" if c.mode == "speculative" else None,
            **emulated,  # the emulated engine's own facts (SGLang's server args) win
        })

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completion")

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def native_generate(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "generate")

    async def _generate(self, request: web.Request, kind: Kind) -> web.StreamResponse:
        if (resp := self._not_ready(request)) is not None:
            return resp
        self.in_flight += 1
        self._idle.clear()
        try:
            return await self._answer(request, kind)
        finally:
            self.in_flight -= 1
            if not self.in_flight:
                self._idle.set()

    async def _answer(self, request: web.Request, kind: Kind) -> web.StreamResponse:
        try:
            try:
                body = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise BadRequest(f"request body is not valid JSON: {exc}") from None
            # Like vLLM: a model it does not serve is a 404 (SGLang's /generate names none).
            model = requested_model(body) if kind != "generate" else None
            if model is not None and model != self.config.model:
                return web.json_response(model_not_found_body(model), status=404)
            spec = parse_request(kind, body, context_length=self.config.context_length,
                                 eos_after_tokens=self.config.eos_after_tokens)
        except BadRequest as exc:
            return web.json_response(error_body(exc.message, param=exc.param, code=400), status=400)
        if (resp := self._faulted()) is not None:
            return resp
        try:
            req = self.scheduler.submit(spec.prompt_tokens, spec.tokens)
        except SchedulerStopped:
            return self._shutting_down()
        builder = ResponseBuilder(kind, self.config.model)
        # finally: a client that hangs up (handler cancelled or write failed)
        # frees its batch slot, as the real engines abort such requests.
        try:
            if spec.stream:
                return await self._stream(request, req, spec, builder)
            try:
                while await req.next_tokens() is not None:
                    pass
            except SchedulerStopped:
                return self._shutting_down()
            text = filler_text(0, req.generated, self.parking.text_seed())
            finish = "abort" if req.aborted else spec.finish_reason
            if kind == "generate":
                return web.json_response(builder.native(text, spec.prompt_tokens, req.generated, finish))
            usage = builder.usage(spec.prompt_tokens, req.generated)
            return web.json_response(builder.full(text, finish, usage))
        finally:
            self.scheduler.cancel(req)

    async def _stream(self, request: web.Request, req: SimRequest, spec: GenerationSpec,
                      builder: ResponseBuilder) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        try:
            await resp.prepare(request)
            await self._stream_events(resp, req, spec, builder)
        except ConnectionResetError:
            # The client hung up between two writes (aiohttp's "Cannot write to closing
            # transport"): the request is aborted in _generate's finally, nothing to report.
            pass
        return resp

    async def _stream_events(self, resp: web.StreamResponse, req: SimRequest, spec: GenerationSpec,
                             builder: ResponseBuilder) -> None:

        async def send(obj: dict[str, Any] | str) -> None:
            payload = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
            await resp.write(f"data: {payload}\n\n".encode())

        # --no-stream-usage plays a server that ignores stream_options.include_usage.
        usage_field = spec.include_usage and self.config.stream_usage
        if builder.kind == "chat":
            await send(builder.chunk(role=True, with_usage_field=usage_field))
        sent = 0
        try:
            while (n := await req.next_tokens()) is not None:
                seed = self.parking.text_seed()
                if builder.kind == "generate":
                    # SGLang streams the text so far; the last token chunk says why it ended.
                    done = spec.finish_reason if sent + n >= req.max_tokens else None
                    await send(builder.native(filler_text(0, sent + n, seed), spec.prompt_tokens,
                                              sent + n, done))
                else:
                    so_far = builder.usage(spec.prompt_tokens, sent + n) \
                        if usage_field and spec.continuous_usage else None
                    await send(builder.chunk(text=filler_text(sent, n, seed), with_usage_field=usage_field,
                                             usage=so_far))
                sent += n
        except SchedulerStopped:
            await send(error_body("the server is shutting down", type_="service_unavailable", code=503))
            return
        if builder.kind != "generate":
            await send(builder.chunk(finish_reason="abort" if req.aborted else spec.finish_reason,
                                     with_usage_field=usage_field))
        if usage_field:
            await send(builder.usage_chunk(builder.usage(spec.prompt_tokens, sent)))
        await send("[DONE]")
        await resp.write_eof()

    @staticmethod
    def _shutting_down() -> web.Response:
        return web.json_response(error_body("the server is shutting down",
                                            type_="service_unavailable", code=503), status=503)


SIM_KEY = web.AppKey("gpuslate_sim_server", SimServer)


@web.middleware
async def _api_key(request: web.Request, handler: Callable[[web.Request], Any]) -> web.StreamResponse:
    """``--api-key``: every ``/v1`` route wants ``Authorization: Bearer KEY``, as vLLM checks it."""
    key = request.app[SIM_KEY].config.api_key
    if key is not None and request.path.startswith("/v1") and \
            not hmac.compare_digest(request.headers.get("Authorization", ""), f"Bearer {key}"):
        return web.json_response(error_body("Unauthorized", type_="authentication_error", code=401),
                                 status=401)
    return await handler(request)


@web.middleware
async def _openai_errors(request: web.Request, handler: Callable[[web.Request], Any]) -> web.StreamResponse:
    """Every error as an OpenAI-shaped JSON body, also those aiohttp raises itself
    (404 unknown route, 405 wrong method, 413 body too large), as the real engines answer."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        detail = f"{exc.reason}: {request.method} {request.path}" if exc.status in (404, 405) else None
        if exc.status == 413:
            limit = request.app[SIM_KEY].config.max_body_bytes
            detail = f"request body too large: the limit is {limit} bytes"
        headers = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
        return web.json_response(http_error_body(exc.status, exc.reason, detail),
                                 status=exc.status, headers=headers)
    except ConnectionResetError:
        # The client hung up while its request was read: nobody to answer, nothing to log.
        return web.Response(status=499)


def create_app(config: ServerConfig, *, worker_pids: Sequence[int] = (),
               log: Log | None = None, memory: Memory | None = None,
               gpu_locked: Callable[[], bool] | None = None, dead_worker: DeadWorker | None = None) -> web.Application:
    """The aiohttp application; its startup hook starts the scheduler and the load. ``memory``: the
    workers' memory a park moves; ``gpu_locked``: whether the driver holds a worker locked now;
    ``dead_worker``: a worker that died, if one did (watched as its engine watches them)."""
    config.validate()
    sim = SimServer(config, worker_pids=worker_pids, log=log, memory=memory, gpu_locked=gpu_locked,
                    dead_worker=dead_worker)
    app = web.Application(client_max_size=config.max_body_bytes, middlewares=[_openai_errors, _api_key])
    app[SIM_KEY] = sim
    app.on_startup.append(sim._on_startup)
    app.on_shutdown.append(sim._on_shutdown)
    app.router.add_get("/health", sim.health)
    app.router.add_get("/health_generate", sim.health_generate)
    app.router.add_get("/v1/models", sim.models)
    app.router.add_get("/v1/models/{model}", sim.model)
    app.router.add_get("/get_server_info", sim.server_info)
    app.router.add_get("/server_info", sim.server_info)  # SGLang's newer name
    played = engine(config.emulate) if config.emulate else None
    if played is not None and VERSION_PATH in played.probes:  # vLLM's and TensorRT-LLM's GET /version
        app.router.add_get(VERSION_PATH, sim.version)
    app.router.add_post("/v1/completions", sim.completions)
    app.router.add_post("/v1/chat/completions", sim.chat_completions)
    app.router.add_post("/generate", sim.native_generate)
    sim.parking.routes(app)
    return app


def bind_socket(host: str, port: int, *, listen: bool = True) -> socket.socket:
    """Bind (and listen, unless ``listen`` is False) now, so the port is taken before the
    (simulated) load starts. Bound but not listening, it is the server's alone and still refuses
    connections: nothing probing it takes the server for up before it serves (the server listens
    when it starts serving, or, playing an engine that listens once loaded, once loaded)."""
    family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                               flags=socket.AI_PASSIVE)[0]
    if listen:
        return socket.create_server(addr[:2], family=family, backlog=1024)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as create_server does
        sock.bind(addr[:2])
    except BaseException:
        sock.close()
        raise
    return sock


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}"


@asynccontextmanager
async def serving(config: ServerConfig, *, worker_pids: Sequence[int] = (), log: Log | None = None,
                  sock: socket.socket | None = None, memory: Memory | None = None,
                  gpu_locked: Callable[[], bool] | None = None, dead_worker: DeadWorker | None = None,
                  until_listening: bool = True) -> AsyncIterator[SimServer]:
    """Serve ``config`` until the block exits, on ``sock`` (bound, not yet listening; else bound here
    from the config, unless its engine binds only once loaded). It listens now, or once loaded as
    its engine does (:class:`~gpuslate.engines.base.Listening`). The block is entered once the port
    takes connections (or the load failed), unless ``until_listening`` is False."""
    app = create_app(config, worker_pids=worker_pids, log=log, memory=memory, gpu_locked=gpu_locked,
                     dead_worker=dead_worker)
    sim = app[SIM_KEY]
    listening = sim.lifecycle.listening
    if sock is None and listening != Listening.AFTER_LOAD:
        sock = bind_socket(config.host, config.port, listen=False)
    # handler_cancellation: a client that disconnects aborts its request.
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=2.0)
    sites: list[web.SockSite] = []

    async def open_port() -> None:
        nonlocal sock
        if sock is None:
            sock = bind_socket(config.host, config.port, listen=False)
        sim.url = _url(sock)
        site = web.SockSite(runner, sock)
        await site.start()  # asyncio listens on the socket now
        sites.append(site)
        sim.log(f"listening on {sim.url}" + (" (503 until ready)" if listening == Listening.AT_ONCE else ""))
        sim.listening.set()

    async def close_port() -> None:
        for site in sites:
            await site.stop()  # no longer listening; the connections it took go on
        sites.clear()

    sim.open_port, sim.close_port = open_port, close_port
    try:
        if sock is not None:
            sim.url = _url(sock)
        await runner.setup()
        if listening == Listening.AT_ONCE:
            await open_port()
        elif listening == Listening.BOUND_REFUSING:
            sim.log(f"bound {sim.url}: connections are refused until it serves")
        else:
            sim.log(f"loading: {config.host}:{config.port} is bound once it is loaded")
        if until_listening:
            await _first(sim.listening, sim.startup_done)
        yield sim
    finally:
        await runner.cleanup()
        if sock is not None:
            sock.close()


async def _first(*events: asyncio.Event) -> None:
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


async def _serve(config: ServerConfig, worker_pids: list[int], sock: socket.socket | None,
                 memory: Memory | None = None, gpu_locked: Callable[[], bool] | None = None,
                 dead_worker: DeadWorker | None = None) -> int:
    log = _stderr_log
    stop = asyncio.Event()
    stopped_by: list[signal.Signals] = []
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        stopped_by.append(sig)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        with suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread
            loop.add_signal_handler(sig, on_signal, sig)
    log(f"{LOG_PREFIX} starting simulated server: model={config.model} mode={config.mode} "
        f"spec_disable_threshold={config.spec_disable_threshold} "
        f"time_scale={config.time_scale} worker_pids={worker_pids}"
        + (f" emulating {config.emulate} {config.engine_version or ''}".rstrip() if config.emulate else ""))
    for warning in config.engine_warnings:  # what the emulated engine logs about its arguments
        log(f"{LOG_PREFIX} WARNING {warning}")
    async with serving(config, worker_pids=worker_pids, log=log, sock=sock, memory=memory,
                       gpu_locked=gpu_locked, dead_worker=dead_worker, until_listening=False) as sim:
        await _first(stop, sim.startup_done, sim.crashed)
        if sim.crashed.is_set() or (sim.status == "failed" and not stop.is_set()):
            return 1
        if not stop.is_set():
            await _first(stop, sim.crashed)
            if sim.crashed.is_set():
                return 1
        t0 = time.monotonic()
        sim.log(f"received {stopped_by[0].name if stopped_by else 'shutdown signal'}, stopping")
        draining = asyncio.create_task(sim.stop(t0))
        crashed = asyncio.create_task(sim.crashed.wait())
        await asyncio.wait([draining, crashed], return_when=asyncio.FIRST_COMPLETED)
        draining.cancel()
        crashed.cancel()
        if sim.crashed.is_set():
            return 1
        linger = t0 + sim.scaled(config.drain_seconds)
    if time.monotonic() < linger:  # slow to go: its port closed, what ran ended, not gone yet
        await asyncio.sleep(linger - time.monotonic())
    log(f"{LOG_PREFIX} server stopped")
    # Ctrl-C: 130, as every gpuslate command interrupted; SIGTERM (a service manager, gpuslate down): 0
    return 130 if stopped_by[:1] == [signal.SIGINT] else 0


def run_server(config: ServerConfig, *, start_workers: Callable[[], list[int]] | None = None,
               memory: Callable[[], Memory | None] | None = None,
               gpu_locked: Callable[[], bool] | None = None, dead_worker: DeadWorker | None = None) -> int:
    """Serve until SIGTERM (exit code 0) or SIGINT (130); 1 if startup fails or the emulated engine dies
    (a fault it plays, a worker gone). The port is taken first, before any worker holds memory (unless
    its engine binds it only once loaded: then a port taken meanwhile fails it then, exit 1): one that
    cannot be (in use, not this host's address) is a :class:`~gpuslate.errors.UsageError`, nothing
    started. ``memory``: called once the workers run, the memory a park moves (docs/sim-server.md,
    Parking); ``gpu_locked``: whether the driver holds a worker locked; ``dead_worker``: a worker that
    died, if one did."""
    config.validate()
    sock = None
    if config.lifecycle.listening != Listening.AFTER_LOAD:
        try:
            # the port taken first, not yet listening: its workers hold their memory before anything
            # that probes the port (a readiness check) can connect
            sock = bind_socket(config.host, config.port, listen=False)
        except OSError as exc:
            why = os.strerror(exc.errno) if exc.errno else str(exc)
            raise UsageError(f"cannot listen on {config.host}:{config.port}: {why.lower()}"
                             + (" (another server listens there: pick another --port)"
                                if exc.errno == errno.EADDRINUSE else "")) from None
    try:
        worker_pids = list(start_workers()) if start_workers is not None else []
        return asyncio.run(_serve(config, worker_pids, sock, memory() if memory is not None else None,
                                  gpu_locked, dead_worker))
    except KeyboardInterrupt:  # a Ctrl-C before the signal handlers were installed
        return 130
    finally:
        if sock is not None:
            sock.close()
