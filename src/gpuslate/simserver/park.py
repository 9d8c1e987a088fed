"""The emulated engines' park endpoints: vLLM's sleep mode and SGLang's memory saver, over HTTP.

The semantics are :mod:`.parkmodel`'s (each park style's, with their sources); what an engine has
(its style, routes, tags, levels, the start flag and environment it needs, the hazards its settings
meet) is its module's ``Engine.park``, read for the server's own command
(:func:`~gpuslate.engines.commands.park_reading`). This module answers the requests as the engine
does, moves the simulated GPU memory (the workers' regions, through
:class:`~gpuslate.gpu.simhost.holder.WorkerControls`), takes the time the engine takes
(``--sleep-seconds``, ``--wake-seconds``, ``--reload-seconds``, divided by ``--time-scale``), and
plays the misbehaviours switched on (``--misbehave``). It also makes the server stall while the
driver holds one of its workers locked or checkpointed (``gpuslate.gpu.simhost.checkpoint``): a
locked process's GPU work waits.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from aiohttp import web

from ..engines.base import HazardEffect, ParkStyle
from .openai_api import error_body
from .parkmodel import (
    MemoryPlan,
    Misbehaviour,
    ParkState,
    Weights,
    release,
    release_tags,
    resume,
    sleep,
    wake,
)
from .scheduler import BatchScheduler
from .serverconfig import ServerConfig


class Server(Protocol):
    """What parking needs of the server (``server.SimServer``; a Protocol: the server imports this module)."""

    @property
    def config(self) -> ServerConfig: ...

    @property
    def scheduler(self) -> BatchScheduler: ...

    @property
    def worker_pids(self) -> list[int]: ...

    def log(self, message: str) -> None: ...

    def crash(self, lines: Sequence[str]) -> None: ...

#: how often the server looks whether the driver holds a worker locked (a listing of DIR/ckpt: cheap)
LOCK_POLL_SECONDS = 0.05
#: with early-return, the memory goes this long after the answer (time-scaled)
EARLY_RETURN_SECONDS = 1.0
_MIXIN = "sglang/srt/managers/scheduler_update_weights_mixin.py"


class Memory(Protocol):
    """The workers' memory (``WorkerControls``): one command to all, the errors back."""

    def command(self, line: str) -> list[str]: ...


class Parking:
    """One server's park endpoints and state (module docstring)."""

    def __init__(self, sim: Server, memory: Memory | None, gpu_locked: Callable[[], bool] | None) -> None:
        self.sim = sim
        self.config = c = sim.config
        self.memory = memory
        self.gpu_locked = gpu_locked
        self.state = ParkState()
        self.reading = r = c.engine_park
        self.facts = r.park if r is not None else None
        self.style = self.facts.style if self.facts is not None else None
        self.misbehave = {Misbehaviour(m) for m in c.misbehave}
        self.env = dict(os.environ)
        # the engine's start flag given (its pools, or its memory saver, track the memory)
        self.flag = r is not None and r.park.flag in r.flags
        # the routes exist only in the environment the engine needs (vLLM's dev mode)
        self.routed = r is not None and all(self.env.get(k) == v for k, v in r.park.env.items())
        self._tasks: list[asyncio.Task[Any]] = []
        # the engines run these calls one at a time (vLLM through its engine core's RPC queue, SGLang
        # through its scheduler's): a wake that arrives during a sleep waits for it
        self._calls = asyncio.Lock()

    def _serial(self, handler: Callable[[web.Request], Any]) -> Callable[[web.Request], Any]:
        """``handler`` one call at a time, run to its end even when its client goes away: the engine
        finishes what it started (its engine core's work is not the HTTP request's), as a park
        cut short by a killed gpuslate leaves it."""
        async def locked(request: web.Request) -> web.StreamResponse:
            async with self._calls:
                return await handler(request)

        async def one_at_a_time(request: web.Request) -> web.StreamResponse:
            task = asyncio.ensure_future(locked(request))
            self._tasks.append(task)
            task.add_done_callback(lambda done: self._tasks.remove(done) if done in self._tasks else None)
            return await asyncio.shield(task)
        return one_at_a_time

    def _frees(self, level: int) -> bool:
        """A park at ``level`` frees memory: the flag given, no hazard of the engine's that frees
        nothing under these settings (expandable segments), no misbehaviour that does."""
        r = self.reading
        return (r is not None and self.flag and Misbehaviour.FREES_NOTHING not in self.misbehave
                and r.park.hazard(level, HazardEffect.FREES_NOTHING, method=r.method, flags=r.flags,
                                  env=self.env) is None)

    def _offloads(self, level: int) -> bool:
        """The level copies the weights into host memory (of those the command allows)."""
        r = self.reading
        return r is not None and any(lv.level == level and lv.offloads for lv, _ in r.levels)

    @property
    def wrong(self) -> Weights | None:
        if Misbehaviour.EMPTY_WEIGHTS in self.misbehave:
            return Weights.EMPTY
        return Weights.GARBAGE if Misbehaviour.WRONG_WEIGHTS in self.misbehave else None

    def routes(self, app: web.Application) -> None:
        f = self.facts
        if f is None:
            return
        app.router.add_get(f.running.call.route, self.running)  # the engine's own, in every mode
        if not self.routed:
            return
        first = f.levels[0]
        park, back = first.park[0].route, first.resume[0].route
        if f.style is ParkStyle.SLEEP:
            app.router.add_post(park, self._serial(self.sleep))
            app.router.add_post(back, self._serial(self.wake_up))
            if f.status is not None:
                app.router.add_get(f.status.route, self.is_sleeping)
            if f.reload_weights is not None:
                app.router.add_post(f.reload_weights.route, self._serial(self.collective_rpc))
        else:
            for path, handler in ((park, self.release), (back, self.resume)):
                app.router.add_get(path, self._serial(handler))
                app.router.add_post(path, self._serial(handler))
            if f.reload_weights is not None:
                app.router.add_post(f.reload_weights.route, self._serial(self.update_weights_from_disk))

    def start(self) -> None:
        if self.gpu_locked is not None:
            self._tasks.append(asyncio.create_task(self._watch_lock()))

    async def stop(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass

    def info(self) -> dict[str, Any]:
        """The simulator's own view, in ``/get_server_info`` (no engine reports this: for tests)."""
        s = self.state
        return {"sleeping": s.is_sleeping, "released": sorted(s.released), "offloaded": s.offloaded,
                "weights": s.weights.value, "level": s.level, "gpu_locked": self.sim.scheduler.gpu_locked}

    def text_seed(self) -> int:
        return self.state.text_seed()

    def generate_fault(self) -> str | None:
        """Why a generation now faults on the GPU (the server then dies), or None: memory that is
        released and not paused behind a scheduler (a release; a sleep woken in part), or a hazard
        of the engine's that faults after the wake from the level it slept at (vLLM #55013: EAGLE-3's
        draft graphs replayed after a level-2 wake)."""
        s, r = self.state, self.reading
        if self.style is ParkStyle.SLEEP and s.paused:
            return None  # it waits in the paused scheduler
        if s.released:
            return ("CUDA error: an illegal memory access was encountered (simulated: the "
                    f"{', '.join(sorted(s.released))} memory is released)")
        if r is not None and s.woke_from is not None:
            h = r.park.hazard(s.woke_from, HazardEffect.FAULTS_AFTER_RESUME, method=r.method, flags=r.flags,
                              env=self.env)
            if h is not None:
                return (f"torch.AcceleratorError: CUDA error: an illegal memory access was encountered (simulated: "
                        f"{h.why}, {h.source})")
        return None

    async def running(self, request: web.Request) -> web.StreamResponse:
        """How many requests run and wait, as the engine says it (its running check's form)."""
        f = self.facts
        assert f is not None
        sched = self.sim.scheduler
        check = f.running
        if check.prometheus:
            running, waiting = sched.running, sched.waiting
            values = [running, waiting] + [0] * max(0, len(check.prometheus) - 2)
            text = "".join(f"# TYPE {name} gauge\n{name}{{model_name=\"{self.config.model}\"}} {float(v)}\n"
                           for name, v in zip(check.prometheus, values))
            return web.Response(text=text, content_type="text/plain")
        return web.json_response([{"dp_rank": 0, **dict.fromkeys(check.keys, sched.busy),
                                   "num_waiting_reqs": sched.waiting}])

    # -- the sleep style (vLLM's) -------------------------------------------------------------------
    async def sleep(self, request: web.Request) -> web.StreamResponse:
        try:
            level = int(request.query.get("level", "1"))
        except ValueError:
            return _error(400, "level must be an integer")
        mode = request.query.get("mode", "abort")
        if mode not in ("abort", "wait", "keep") or level not in (0, 1, 2):
            return _error(500, f"ValueError: Invalid pause mode: {mode}" if level in (0, 1, 2)
                          else f"ValueError: invalid sleep level {level}")
        sched = self.sim.scheduler
        if Misbehaviour.CRASH_IN_FLIGHT in self.misbehave and sched.busy:
            # the sleep "succeeds" (200 in ~300 ms) while the engine faults on the memory it freed (#28714)
            asyncio.get_running_loop().call_later(0.05, self.sim.crash, [
                "CUDA error: an illegal memory access was encountered (simulated: a sleep with "
                f"{sched.busy} requests in flight, vLLM #28714)"])
            return web.Response(status=200)
        if mode == "abort":
            sched.abort_all()
        sched.pause(freeze=mode == "keep")
        if mode == "wait":
            await sched.drained()
        before = copy.deepcopy(self.state)
        assert self.facts is not None
        plan = sleep(self.state, level, self.facts.tags, offloads=self._offloads(level), frees=self._frees(level),
                     leak=Misbehaviour.LEAK in self.misbehave)
        if plan is None:
            self.sim.log("WARNING Executor is already sleeping.")
            return web.Response(status=200)
        failed = await self._move(plan, self.config.sleep_seconds)
        if failed:
            self.state = before
            sched.unpause()
            return _error(500, failed)
        self.sim.log(f"It took {self.config.sleep_seconds / self.config.time_scale:.6f} seconds to fall asleep.")
        return web.Response(status=200)

    async def wake_up(self, request: web.Request) -> web.StreamResponse:
        tags = request.query.getall("tags", []) or None
        before = copy.deepcopy(self.state)
        plan = wake(self.state, tags, wrong=self.wrong)
        self.sim.log(f"wake up the engine with tags: {tags}")
        if plan is None:
            self.sim.log("WARNING Executor is not sleeping." if not before.sleeping
                         else f"WARNING Tag {tags} is not in sleeping tags {sorted(before.sleeping)}")
            if not before.sleeping:
                self.sim.scheduler.unpause()
            return web.Response(status=200)
        failed = await self._move(plan, self.config.wake_seconds)
        if failed:  # as vLLM: "RuntimeError: CUDA Error: out of memory at .../cumem_allocator.cpp:163"
            self.state = before
            return _error(500, f"RuntimeError: CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:163 "
                          f"(simulated: {failed})")
        self.sim.scheduler.unpause()
        return web.Response(status=200)

    async def is_sleeping(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"is_sleeping": self.state.is_sleeping})

    async def collective_rpc(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return web.json_response({"detail": f"JSON decode error: {exc}"}, status=400)
        method = body.get("method") if isinstance(body, dict) else None
        if method is None:
            return web.json_response({"detail": "Missing 'method' in request body"}, status=400)
        if method != "reload_weights":
            return _error(500, f"AttributeError: worker has no method {method!r} (the simulator plays reload_weights)")
        if "weights" in self.state.released:
            return _error(500, "CUDA error: an illegal memory access was encountered (simulated: reload_weights into "
                          "sleeping weights: wake_up?tags=weights first)")
        await asyncio.sleep(self._reload_seconds() / self.config.time_scale)
        self.state.come_back(self.wrong or Weights.LOADED)  # the graphs stay as captured (a hazard's)
        return web.json_response({"results": [None] * max(1, len(self.sim.worker_pids))})

    # -- the release style (SGLang's) -----------------------------------------------------------------
    async def _sglang_tags(self, request: web.Request) -> list[str] | web.Response:
        body: Any = {}
        if request.can_read_body:
            try:
                body = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError):
                return _sglang_error("invalid JSON body")
        assert self.facts is not None
        tags = release_tags(body.get("tags") if isinstance(body, dict) else None, self.facts.tags)
        return _sglang_error(tags) if isinstance(tags, str) else tags

    async def release(self, request: web.Request) -> web.StreamResponse:
        tags = await self._sglang_tags(request)
        if isinstance(tags, web.Response):
            return tags
        if self.sim.scheduler.busy:
            self.sim.crash(["Scheduler hit an exception: Traceback (most recent call last):",
                            f'  File "{_MIXIN}", in release_memory_occupation',
                            "AssertionError: release_memory_occupation should be called only when no ongoing request."])
            await asyncio.Event().wait()  # the server dies under this request: no answer
        plan = release(self.state, tags, saver=self._frees(1), offloads=any(self._offloads(lv) for lv in (1, 2)),
                       leak=Misbehaviour.LEAK in self.misbehave)
        failed = await self._move(plan, self.config.sleep_seconds)
        return _sglang_error(failed) if failed else web.json_response(None)

    async def resume(self, request: web.Request) -> web.StreamResponse:
        tags = await self._sglang_tags(request)
        if isinstance(tags, web.Response):
            return tags
        before = copy.deepcopy(self.state)
        plan = resume(self.state, tags, wrong=self.wrong)
        if plan is None:
            missing = next(t for t in tags if t not in self.state.sleeping)
            self.sim.crash(["Scheduler hit an exception: Traceback (most recent call last):",
                            f'  File "{_MIXIN}", in resume_memory_occupation',
                            "    self.offload_tags.remove(tag)", f"KeyError: {missing!r}"])
            await asyncio.Event().wait()
        assert plan is not None
        failed = await self._move(plan, self.config.wake_seconds)
        if failed:
            self.state = before
            return _sglang_error(f"CUDA out of memory: {failed}")
        return web.json_response(None)

    async def update_weights_from_disk(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return web.json_response({"success": False, "message": "invalid JSON body"}, status=400)
        path = body.get("model_path") if isinstance(body, dict) else None
        if not isinstance(path, str) or not path:
            return web.json_response({"success": False, "message": "model_path is required"}, status=400)
        if "weights" in self.state.released:
            return web.json_response({"success": False, "message": "the weights are released: resume_memory_occupation "
                                      "with tags [\"weights\"] first (simulated)"}, status=400)
        await asyncio.sleep(self._reload_seconds() / self.config.time_scale)
        self.state.come_back(self.wrong or Weights.LOADED)
        return web.json_response({"success": True, "message": "Succeeded to update model weights."})

    # -- memory ---------------------------------------------------------------------
    def _reload_seconds(self) -> float:
        c = self.config
        return c.reload_seconds if c.reload_seconds is not None else c.startup_seconds * 0.5

    async def _move(self, plan: MemoryPlan, seconds: float) -> str | None:
        """Do ``plan`` on the workers' memory in the time the engine takes; the first error, or None.
        With early-return, memory is let go only after the answer (SGLang's release; vLLM in v0)."""
        delay = seconds / self.config.time_scale
        if plan.release and Misbehaviour.EARLY_RETURN in self.misbehave:
            later = delay + EARLY_RETURN_SECONDS / self.config.time_scale
            self._tasks.append(asyncio.create_task(self._later(plan, later)))
            return None
        await asyncio.sleep(delay)
        return await self._do(plan)

    async def _later(self, plan: MemoryPlan, delay: float) -> None:
        await asyncio.sleep(delay)
        failed = await self._do(plan)
        if failed:
            self.sim.log(f"ERROR releasing memory: {failed}")

    async def _do(self, plan: MemoryPlan) -> str | None:
        if self.memory is None:
            return None
        lines = []
        if plan.offload:
            lines.append("offload weights")
        if plan.release:
            lines.append("release " + " ".join(plan.release))
        if plan.acquire:
            lines.append("acquire " + " ".join(plan.acquire))
        if plan.drop_offload:
            lines.append("drop")
        memory = self.memory
        for line in lines:
            errors = await asyncio.to_thread(memory.command, line)
            if errors:
                return errors[0]
        return None

    async def _watch_lock(self) -> None:
        assert self.gpu_locked is not None
        while True:
            self.sim.scheduler.set_gpu_locked(self.gpu_locked())
            await asyncio.sleep(LOCK_POLL_SECONDS)


def _error(status: int, message: str) -> web.Response:
    return web.json_response(error_body(message, type_="server_error" if status >= 500 else "invalid_request_error",
                                        code=status), status=status)


def _sglang_error(message: str) -> web.Response:
    """SGLang's _create_error_response: 400 with ``{"error": {"message": ...}}``."""
    return web.json_response({"error": {"message": message}}, status=400)
