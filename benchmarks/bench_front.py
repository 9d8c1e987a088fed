"""Swaps behind a front: what a client at constant concurrency sees, and what the front costs when
nothing changes. On a simulated host (no GPU needed), or with a real server on this host's GPUs,
with the front extra's Caddy:

    .venv/bin/python benchmarks/bench_front.py [--engine sim|vllm|sglang|trtllm] [--swaps 10] [--concurrency 8]
        [--steady-s 10] [--switch restart|park|both] [--park-method M] [--out FILE]
    .venv/bin/python benchmarks/bench_front.py --serve 'transformers serve /models/x --port {port} --host 127.0.0.1'
        --model /models/x [--serve-b CMD] [--ready /v1/models] [--gpus 0] [--start-timeout 600]
        [--switch both] [--park-method auto] [--budget-s 540] [--out FILE]

1. Two units, ``a`` behind ``--front`` and ``b``, each on its own port (a parked server keeps its
   port), declared in a unit file in a fresh state folder (``GPUSLATE_STATE_DIR``,
   ``GPUSLATE_LOCK_DIR`` and ``GPUSLATE_CONFIG`` in a temporary folder: nothing else's state is
   read or touched).

   - Simulated (the default): a fresh simulated host of one GPU. With ``--engine sim`` (the
     default) the simulator's own server (readiness as SGLang's, ``b`` in speculative mode); with
     ``--engine vllm|sglang|trtllm`` the simulator playing that engine (``--emulate``: its own
     arguments, readiness, start and stop), ``b`` the same deployment; where the swaps park, both
     are started with the engine's park flag and environment (``Engine.park``).
   - Real (``--serve CMD``): ``a`` runs CMD (shell-split; ``{port}`` replaced by the unit's port),
     ``b`` ``--serve-b`` (default: the same command), on ``--gpus``, ready when ``--ready`` answers
     200, the requests (and the park's reference answer) for ``--model``: for ``transformers serve
     DIR``, DIR as written (a server pinned to a model answers 400 to any other name). No
     ``GPUSLATE_SIM``: the NVIDIA driver; ``--sim-host`` instead points the same run at a fresh
     simulated host (a dry run of this mode, with ``--serve 'python -m gpuslate sim serve ...'``).

   Where the swaps park (``--switch park|both``), ``b`` is started and parked first, so that every
   ``swap --park`` parks one and resumes the other; the units park as ``--park-method`` says (the
   unit file's ``park``; auto: what the command allows, the driver's checkpoint for one CUDA process
   such as ``transformers serve``).
2. Steady: the client streams through the front for ``--steady-s`` s, then straight to the unit for as
   long: the front's cost when nothing changes (median and p99 time to first byte and end to end,
   measured in one run, as a difference and a ratio).
3. Swaps: the client streams through the front for the whole run while the switch goes on,
   ``--swaps`` in all: ``restart`` alternates ``gpuslate restart X`` and ``swap X Y``; ``park``
   alternates ``swap a b --park`` and ``swap b a --park``; ``both`` alternates ``restart X`` and
   ``swap X Y --park``. Every request is recorded, and each swap's document (``--json``): the
   front's hold and drain, the downtime and its parts, and for a park the park's and the resume's
   status, method and timings, and whether the switch fell back to a cold stop or start.
   A request's *added latency* is its latency less the steady median through the front; the bound
   checked is each swap's downtime (OLD told to stop -> NEW ready; the swap's wall time where a
   document has none) + its drain (the requests in flight on OLD finishing there, while new ones
   are held: a request held first waits for it too) + 0.5 s. The hold (hold -> route: drain +
   downtime + the route) is printed beside it, and the largest excess of a request's added latency
   over the downtime alone (issue 35's bound: at most downtime + 0.5 s).

Failures (an HTTP error, a refused or reset connection, an error event) and cut streams (no end:
``data: [DONE]``, or with ``--stream-end finish``, the default with ``--serve``, a chunk with a
``finish_reason``, as ``transformers serve`` ends its streams) are counted, per swap verb too. Every
gpuslate call is bounded in time, and the whole run by ``--budget-s`` (540 s with ``--serve``: under
a 10-minute command limit; no swap starts that would not fit); ``down b``, ``down a`` and ``rm``
run at the end whatever happened, so no server outlives the script. Everything is written to
``--out`` (JSON) after every step, so a failed or killed run leaves what it had. Exit 0 when all went as it should; 1 if a request failed, a stream was cut, a request's
added latency was over its bound, a swap failed, or a ``swap --park`` fell back to the cold way;
2 for bad input (nothing started).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests" / "units")]

from frontkit import Req, StreamLoad  # noqa: E402 - after the path above
from gpuslate.engines.registry import BACKENDS  # noqa: E402
from gpuslate.errors import UsageError  # noqa: E402
from gpuslate.front.caddy import find_caddy  # noqa: E402
from gpuslate.options import PARK_WAYS  # noqa: E402

SWITCHES = ("restart", "park", "both")
#: a ``down`` (grace, SIGKILL, the memory's release verified) and an ``rm``, at most; within a
#: ``--budget-s``, the end's three calls share TEARDOWN_S
DOWN_TIMEOUT_S, RM_TIMEOUT_S, TEARDOWN_S = 240.0, 60.0, 120.0


class Gs:
    """gpuslate's command line in the bench's environment; every call bounded by ``timeout``, and by
    ``deadline`` (monotonic) when there is one (killed then, answered as exit 124 with what it
    printed)."""

    def __init__(self, env: dict[str, str], deadline: float | None = None) -> None:
        self.env, self.deadline = env, deadline

    def left(self) -> float:
        """Seconds to the deadline (inf without one)."""
        return float("inf") if self.deadline is None else self.deadline - time.monotonic()

    def __call__(self, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "gpuslate", *args]
        timeout = max(1.0, min(timeout, self.left()))
        try:
            return subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=timeout,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            return subprocess.CompletedProcess(argv, 124, _text(exc.stdout),
                                               _text(exc.stderr) + f"\n(gpuslate killed after {timeout:g} s)")


def _text(out: bytes | str | None) -> str:
    return out.decode("utf-8", "replace") if isinstance(out, bytes) else (out or "")


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports (all bound at once, so none is given twice)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, round(q * (len(v) - 1)))]


def steady(url: str, seconds: float, load_kw: dict[str, Any]) -> dict[str, float]:
    with StreamLoad(url, **load_kw) as load:
        time.sleep(seconds)  # a measurement window, not a wait for a condition
        records = load.stop()
    ok = [r for r in records if r.ok and r.first is not None]
    ttfb = [r.first - r.start for r in ok if r.first is not None]
    e2e = [r.latency for r in ok]
    return {"requests": len(records), "failed": len(records) - len(ok), "ttfb_p50_ms": 1e3 * pct(ttfb, 0.5),
            "ttfb_p99_ms": 1e3 * pct(ttfb, 0.99), "e2e_p50_ms": 1e3 * pct(e2e, 0.5), "e2e_p99_ms": 1e3 * pct(e2e, 0.99)}


@dataclass
class Deployment:
    """What one unit of the bench runs, and how it is known to be ready."""

    command: list[str]
    engine: str | None = None  # readiness (and park facts) as this engine's
    ready: str | None = None  # else: ready when GET this path answers 200
    env: dict[str, str] = field(default_factory=dict)
    model: str | None = None  # the model name requests (and the park's reference answer) use


def simulated(engine: str, port: int, startup_s: float, second: bool, parks: bool) -> Deployment:
    """The simulator's own server, or the simulator playing ``engine``; where the swaps park, started
    with the flag and environment its engine parks with, at its best level."""
    head = [sys.executable, "-m", "gpuslate", "sim", "serve", "--startup-seconds", str(startup_s), "--memory", "1GiB"]
    if engine == "sim":
        return Deployment([*head, "--port", str(port), *(["--mode", "speculative"] if second else [])],
                          engine="sglang", model="sim-model")
    args = {"vllm": ["serve", "sim-model", "--served-model-name", "sim-model"],
            "sglang": ["--model-path", "sim-model"], "trtllm": ["sim-model", "--host", "127.0.0.1"]}[engine]
    park = BACKENDS[engine].park if parks else None
    flags: tuple[str, ...] = ()
    env: dict[str, str] = {}
    if park is not None:
        best = park.levels[0]
        flags = (park.flag, *((best.needs_flag,) if best.needs_flag else ()))
        env = dict(park.env)
    return Deployment([*head, "--emulate", engine, "--", *args, "--port", str(port), *flags], engine=engine, env=env,
                      model="sim-model")


def served(template: str, port: int, ready: str, model: str) -> Deployment:
    """A real server's command: ``template`` shell-split, ``{port}`` replaced in each word."""
    return Deployment([w.replace("{port}", str(port)) for w in shlex.split(template)], ready=ready, model=model)


def unit_toml(name: str, d: Deployment, *, port: int, gpus: str, start_timeout: float, grace: float,
              park: str, front: int | None) -> str:
    lines = [f"[units.{name}]", f"command = {json.dumps(d.command)}", f"gpus = {json.dumps(gpus)}", f"port = {port}",
             f"start_timeout = {start_timeout:g}", f"grace = {grace:g}"]
    if d.engine is not None:
        lines.append(f"engine = {json.dumps(d.engine)}")
    if d.ready is not None:
        lines.append(f"ready_url = {json.dumps(d.ready)}")
    if d.model is not None:
        lines.append(f"model = {json.dumps(d.model)}")
    if d.env:
        lines.append("env = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in d.env.items()) + " }")
    if park != "auto":
        lines.append(f"park = {json.dumps(park)}")
    if front is not None:
        lines.append(f"front = {front}")
    return "\n".join(lines) + "\n"


def verb_for(i: int, serving: str, switch: str) -> list[str]:
    """The ``i``-th swap's command words, the unit ``serving`` now."""
    other = "b" if serving == "a" else "a"
    if switch == "park":
        return ["swap", serving, other, "--park"]
    if i % 2 == 0:
        return ["restart", serving]
    return ["swap", serving, other, *(["--park"] if switch == "both" else [])]


def kind_of(verb: list[str]) -> str:
    """A swap verb's kind, for the totals: restart, swap, swap --park."""
    return "swap --park" if "--park" in verb else verb[0]


def document(out: str) -> dict[str, Any]:
    """A command's JSON document ({} when it printed none: a crash, a kill)."""
    try:
        doc = json.loads(out)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _int(v: Any) -> int:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else 0


def _obj(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def swap_record(verb: list[str], t0: float, t1: float, res: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """What one swap did, read from its document (``gpuslate.swap.v1`` or ``gpuslate.restart.v1``);
    a field a document lacks (a park swap's parts, a restart's switch, a crashed command's all) is
    None, never a crash."""
    doc = document(res.stdout)
    fr = _obj(doc.get("front"))
    hold, drain = _obj(fr.get("hold")), _obj(fr.get("drain"))
    parked, resumed = _obj(doc.get("parked")), _obj(doc.get("resumed"))
    rec: dict[str, Any] = {
        "verb": " ".join(verb), "kind": kind_of(verb), "t0": t0, "t1": t1, "wall_s": t1 - t0, "rc": res.returncode,
        "ok": res.returncode == 0 and doc.get("ok") is True, "status": doc.get("status"),
        "switch": doc.get("switch") if verb[0] == "swap" else ("restart" if doc else None),
        "fallback": doc.get("fallback"), "downtime_s": _num(doc.get("downtime_s")),
        "downtime": doc.get("downtime"), "phases": doc.get("phases"), "total_s": _num(doc.get("total_s")),
        "front_state": fr.get("state"), "front_unit": fr.get("unit"), "front_note": fr.get("note"),
        "hold_s": _num(hold.get("seconds")), "held": _int(hold.get("held")),
        "longest_hold_s": _num(hold.get("longest_hold_s")), "most_held": _int(hold.get("most_held")),
        "front_failed": _int(hold.get("failed")), "drained": _int(drain.get("in_flight")),
        "drain_s": _num(drain.get("seconds")), "cut": _int(drain.get("cut")),
        "park": None, "resume": None,
    }
    if parked:
        rec["park"] = {k: parked.get(k) for k in ("status", "method", "why", "reason", "host_bytes", "undone")}
        rec["park"]["timings"] = parked.get("timings")
    if resumed:
        rec["resume"] = {k: resumed.get(k) for k in ("status", "method", "reason")}
        rec["resume"]["answer_same"] = _obj(resumed.get("answer")).get("same")
        rec["resume"]["timings"] = resumed.get("timings")
    rec["fell_back"] = "--park" in verb and rec["ok"] and rec["switch"] != "park"
    if not rec["ok"]:
        rec["stderr"] = res.stderr[-3000:]
        if not doc:
            rec["stdout"] = res.stdout[-3000:]
    return rec


def _timing(part: dict[str, Any] | None, key: str) -> float | None:
    return _num(_obj(_obj(part).get("timings")).get(key))


def _f(v: float | None, width: int, digits: int = 3, unit: str = "s") -> str:
    return f"{'-':>{width}}" if v is None else f"{v:{width - len(unit)}.{digits}f}{unit}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--engine", choices=("sim", "vllm", "sglang", "trtllm"), default=None,
                    help="simulated mode: the simulator's own server (default), or the simulator playing this engine")
    ap.add_argument("--serve", metavar="CMD", help="real mode: unit a's command, shell-split, {port} replaced by its "
                    "port (e.g. 'transformers serve DIR --port {port} --host 127.0.0.1')")
    ap.add_argument("--serve-b", metavar="CMD", help="real mode: unit b's command (default: --serve's)")
    ap.add_argument("--ready", default="/v1/models", metavar="PATH",
                    help="real mode: ready when GET PATH answers 200 (default /v1/models)")
    ap.add_argument("--model", help="the model name the requests send (real mode: required; for 'transformers "
                    "serve DIR', DIR as written); simulated: sim-model")
    ap.add_argument("--gpus", default="0", help="the units' GPUs (default 0)")
    ap.add_argument("--sim-host", action="store_true",
                    help="real mode on a fresh simulated host instead of the NVIDIA driver (a dry run)")
    ap.add_argument("--start-timeout", type=float, default=None,
                    help="most seconds a unit may take to become ready (default: 600 real, 60 simulated)")
    ap.add_argument("--switch", choices=SWITCHES, default=None,
                    help="restart (restart / swap), park (swap --park both ways) or both (restart / swap --park); "
                    "default: both with --serve, restart simulated")
    ap.add_argument("--park-method", choices=PARK_WAYS, default="auto",
                    help="the units' park setting (the unit file's park; default auto)")
    ap.add_argument("--stream-end", choices=("done", "finish"), default=None,
                    help="what makes a stream whole: done (data: [DONE]) or finish (that, or a chunk with a "
                    "finish_reason: transformers serve sends no [DONE]); default: finish with --serve, else done")
    ap.add_argument("--swaps", type=int, default=10)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=24, help="tokens per request (default 24)")
    ap.add_argument("--request-timeout", type=float, default=120.0,
                    help="most seconds one request may take, held ones included (default 120)")
    ap.add_argument("--steady-s", type=float, default=10.0)
    ap.add_argument("--budget-s", type=float, default=None,
                    help="the whole run's most seconds, the end's down and rm included: no swap starts that "
                    "would not fit, every call is cut at it (default: 540 with --serve, under a 600 s command "
                    "limit; 0: none)")
    ap.add_argument("--startup-s", type=float, default=1.0, help="simulated mode: the simulated server's load time")
    ap.add_argument("--out", type=Path)
    return ap.parse_args(argv)


def check(args: argparse.Namespace) -> str | None:
    """Bad input, as one line (nothing started), or None."""
    real = args.serve is not None
    if real:
        if args.engine is not None:
            return "--engine is for the simulated mode; --serve runs the command it is given"
        for flag, cmd in (("--serve", args.serve), ("--serve-b", args.serve_b)):
            if cmd is None:
                continue
            try:
                words = shlex.split(cmd)
            except ValueError as exc:
                return f"{flag}: {exc}"
            if not words:
                return f"{flag}: an empty command"
            if not any("{port}" in w for w in words):
                return f"{flag}: the command must serve on {{port}} (each unit has its own port)"
        if not args.model:
            return "--model is required with --serve (for 'transformers serve DIR': DIR as written)"
        if not args.ready.startswith("/"):
            return f"--ready: a path such as /v1/models, not {args.ready!r}"
    else:
        for flag in ("serve_b", "sim_host"):
            if getattr(args, flag):
                return f"--{flag.replace('_', '-')} is for the real mode (--serve)"
    if args.swaps < 1 or args.concurrency < 1 or args.max_tokens < 1:
        return "--swaps, --concurrency and --max-tokens must be at least 1"
    if args.start_timeout is not None and args.start_timeout <= 0:
        return "--start-timeout must be positive"
    if args.budget_s is not None and (args.budget_s < 0 or 0 < args.budget_s < 2 * TEARDOWN_S):
        return f"--budget-s: at least {2 * TEARDOWN_S:g} s (the end's down and rm take up to {TEARDOWN_S:g}), or 0"
    return None


def teardown(gs: Gs, budget: bool) -> list[dict[str, Any]]:
    """``down b``, ``down a``, ``rm b`` and ``rm a``, each run whatever the others did, each bounded (within a
    budget, by their share of TEARDOWN_S)."""
    gs.deadline = None  # what the run left is theirs: they have their own bounds
    down_s, rm_s = (0.4 * TEARDOWN_S, 0.1 * TEARDOWN_S) if budget else (DOWN_TIMEOUT_S, RM_TIMEOUT_S)
    done: list[dict[str, Any]] = []
    for args, timeout in ((("down", "b", "--yes", "--json"), down_s), (("down", "a", "--yes", "--json"), down_s),
                          (("rm", "b"), rm_s), (("rm", "a"), rm_s)):  # one by one: rm of an unknown one removes none
        try:
            r = gs(*args, timeout=timeout)
        except OSError as exc:
            done.append({"command": " ".join(args), "rc": None, "error": str(exc)})
            continue
        done.append({"command": " ".join(args), "rc": r.returncode})
        if r.returncode not in (0, 2):  # 2: a unit that never started, or one already removed
            print(f"bench_front: 'gpuslate {' '.join(args)}' exited {r.returncode}: {r.stderr.strip()[-500:]}",
                  file=sys.stderr)
            done[-1]["stderr"] = r.stderr[-2000:]
    return done


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    problem = check(args)
    if problem is not None:
        print(f"bench_front: {problem}", file=sys.stderr)
        return 2
    real = args.serve is not None
    switch = args.switch or ("both" if real else "restart")
    start_timeout = args.start_timeout or (600.0 if real else 60.0)
    end = args.stream_end or ("finish" if real else "done")
    try:
        caddy, version = find_caddy()
    except UsageError as exc:
        print(f"bench_front: {exc}", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="gpuslate-bench-front-"))
    env = {k: v for k, v in os.environ.items()
           if k not in ("GPUSLATE_SIM", "GPUSLATE_CONFIG", "GPUSLATE_STATE_DIR", "GPUSLATE_LOCK_DIR")}
    env.update(GPUSLATE_STATE_DIR=str(tmp / "state"), GPUSLATE_LOCK_DIR=str(tmp / "locks"),
               GPUSLATE_CONFIG=str(tmp / "gpuslate.toml"),
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p))
    simulated_host = not real or args.sim_host
    if simulated_host:
        env["GPUSLATE_SIM"] = str(tmp / "sim")
    engine = args.engine or "sim"
    model = args.model if real else (args.model or "sim-model")
    result: dict[str, Any] = {
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} CPUs",
        "mode": "real" if real else "simulated", "host": "simulated" if simulated_host else "nvidia",
        "engine": None if real else engine, "serve": args.serve, "serve_b": args.serve_b or args.serve,
        "model": model, "ready": args.ready if real else None, "gpus": args.gpus, "switch": switch,
        "park_method": args.park_method, "stream_end": end, "caddy": ".".join(map(str, version)),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "concurrency": args.concurrency,
        "max_tokens": args.max_tokens, "swaps_asked": args.swaps, "work": str(tmp), "setup": [], "swaps": [],
    }
    budget = args.budget_s if args.budget_s is not None else (540.0 if real else 0.0)
    result["budget_s"] = budget or None
    gs = Gs(env, time.monotonic() + budget - TEARDOWN_S if budget else None)

    def save() -> None:  # after each step too: a run killed from outside leaves what it had
        if args.out:
            args.out.write_text(json.dumps(result, indent=2, default=str))

    rc = 1
    try:
        rc = run(args, gs, result, save, real=real, switch=switch, start_timeout=start_timeout, end=end,
                 model=model, engine=engine, caddy=str(caddy))
    except Exception as exc:  # said in one line and in the document; the units are stopped all the same
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()
        print(f"bench_front: {result['error']}", file=sys.stderr)
        rc = 1
    finally:
        save()
        result["teardown"] = teardown(gs, bool(budget))
        result["exit"] = rc
        save()
    return rc


def run(args: argparse.Namespace, gs: Gs, result: dict[str, Any], save: Callable[[], None], *, real: bool,
        switch: str, start_timeout: float, end: str, model: str, engine: str, caddy: str) -> int:
    op_timeout = start_timeout + 300.0  # a restart or swap: OLD stopped (or parked), NEW started (or resumed)
    env = gs.env
    parks = switch in ("park", "both")
    pa, pb, fport = free_ports(3)
    if real:
        da = served(args.serve, pa, args.ready, model)
        db = served(args.serve_b or args.serve, pb, args.ready, model)
    else:
        da = simulated(engine, pa, args.startup_s, False, parks)
        db = simulated(engine, pb, args.startup_s, True, parks)
    grace = 10.0 if real else 2.0
    common = {"gpus": args.gpus, "start_timeout": start_timeout, "grace": grace, "park": args.park_method}
    Path(env["GPUSLATE_CONFIG"]).write_text(unit_toml("a", da, port=pa, front=fport, **common) + "\n"
                                            + unit_toml("b", db, port=pb, front=None, **common))
    result["units"] = {"a": {"command": da.command, "port": pa}, "b": {"command": db.command, "port": pb},
                       "front": fport}

    def step(*words: str, timeout: float) -> dict[str, Any]:
        t = time.monotonic()
        r = gs(*words, "--json", timeout=timeout)
        doc = document(r.stdout)
        rec = {"command": "gpuslate " + " ".join(words), "rc": r.returncode, "seconds": time.monotonic() - t,
               "status": doc.get("status"), "ok": r.returncode == 0}
        if words[0] == "park":
            rec["method"], rec["why"] = doc.get("method"), doc.get("why")
        if r.returncode != 0:
            rec["stderr"], rec["document"] = r.stderr[-3000:], doc or r.stdout[-3000:]
            print(f"bench_front: {rec['command']} exited {r.returncode}: {r.stderr.strip()[-800:]}", file=sys.stderr)
        result["setup"].append(rec)
        save()
        return rec

    if "GPUSLATE_SIM" in env:
        r = gs("sim", "init", env["GPUSLATE_SIM"], "--count", "1", timeout=120)
        if r.returncode != 0:
            print(f"bench_front: sim init: {r.stderr.strip()}", file=sys.stderr)
            return 1
    if parks:  # b resident and parked first: every swap --park then parks one and resumes the other
        if not step("up", "b", timeout=op_timeout)["ok"]:
            return 1
        if not step("park", "b", timeout=op_timeout)["ok"]:
            print("bench_front: b could not be parked: stopped, the swaps go on (each --park swap will say how it "
                  "fell back)", file=sys.stderr)
            if not step("down", "b", "--yes", timeout=DOWN_TIMEOUT_S)["ok"]:
                return 1
    if not step("up", "a", timeout=op_timeout)["ok"]:
        return 1

    front, direct = f"http://127.0.0.1:{fport}", f"http://127.0.0.1:{pa}"
    load_kw: dict[str, Any] = {"concurrency": args.concurrency, "max_tokens": args.max_tokens,
                               "timeout": args.request_timeout, "model": model, "end": end}
    through = steady(front, args.steady_s, load_kw)
    straight = steady(direct, args.steady_s, load_kw)
    result["steady_front"], result["steady_direct"] = through, straight
    swaps: list[dict[str, Any]] = result["swaps"]
    stopped_early: str | None = None
    with StreamLoad(front, **load_kw) as load:
        load.wait_done(2 * args.concurrency, timeout=args.request_timeout)
        serving = "a"
        for i in range(args.swaps):
            verb = verb_for(i, serving, switch)
            before = [s["wall_s"] for s in swaps if s["kind"] == kind_of(verb)]
            need = 1.5 * max(before, default=30.0) + 10.0  # the swap, and the requests after it
            if gs.left() < need:
                stopped_early = (f"the budget: {gs.left():.0f} s left before the end's down and rm, "
                                 f"'{' '.join(verb)}' may take {need:.0f}")
                print(f"bench_front: {stopped_early}", file=sys.stderr)
                break
            t0 = time.monotonic()
            res = gs(*verb, "--json", "--yes", timeout=op_timeout)
            t1 = time.monotonic()
            rec = swap_record(verb, t0, t1, res)
            swaps.append(rec)
            save()
            if not rec["ok"]:
                stopped_early = f"'gpuslate {rec['verb']}' exited {res.returncode} ({rec['status']})"
                print(f"bench_front: {stopped_early}: {res.stderr.strip()[-800:]}", file=sys.stderr)
                break
            if verb[0] == "swap":
                serving = verb[2]
            try:
                load.wait_done(2 * args.concurrency, timeout=min(args.request_timeout, max(1.0, gs.left())))
            except AssertionError as exc:
                stopped_early = f"after '{rec['verb']}': {exc}"
                print(f"bench_front: {stopped_early}", file=sys.stderr)
                break
        # held requests of a swap that failed may wait for their own timeout: not past the budget
        records = load.stop(wait=None if stopped_early is None and gs.left() > args.request_timeout + 10
                            else min(30.0, max(1.0, gs.left())))
    result["stopped_early"] = stopped_early
    return report(result, records, through, straight, caddy, real)


def report(result: dict[str, Any], records: list[Req], through: dict[str, float], straight: dict[str, float],
           caddy: str, real: bool) -> int:
    """The figures: each swap's requests and bound, the totals per swap verb; printed, kept in ``result``."""
    swaps: list[dict[str, Any]] = result["swaps"]
    base = through["e2e_p50_ms"] / 1e3
    failed = [r for r in records if r.error]
    cut = [r for r in records if r.cut]
    unfinished = [r for r in records if not r.end]  # still running when the load stopped
    over = []
    for s in swaps:
        during: list[Req] = [r for r in records if r.end >= s["t0"] and r.start <= s["t1"]]
        s["requests"] = len(during)
        s["failed_requests"] = sum(1 for r in during if r.error)
        s["cut_requests"] = sum(1 for r in during if r.cut)
        down = s["downtime_s"] if s["downtime_s"] is not None else s["wall_s"]
        s["max_added_s"] = max((r.latency - base for r in during), default=0.0)
        s["bound_s"] = down + (s["drain_s"] or 0.0) + 0.5
        s["over_downtime_s"] = s["max_added_s"] - down  # issue 35's bound: at most 0.5
        if s["max_added_s"] > s["bound_s"]:
            over.append(s)
    by_verb: dict[str, dict[str, Any]] = {}
    for kind in dict.fromkeys(s["kind"] for s in swaps):
        these = [s for s in swaps if s["kind"] == kind]
        downs = [s["downtime_s"] for s in these if s["downtime_s"] is not None]
        holds = [s["longest_hold_s"] for s in these if s["longest_hold_s"] is not None]
        by_verb[kind] = {
            "swaps": len(these), "failed_swaps": sum(1 for s in these if not s["ok"]),
            "fell_back": sum(1 for s in these if s["fell_back"]),
            "requests": sum(s["requests"] for s in these), "failed": sum(s["failed_requests"] for s in these),
            "cut": sum(s["cut_requests"] for s in these), "drain_cut": sum(s["cut"] for s in these),
            "longest_hold_s": max(holds, default=None), "downtime_median_s": statistics.median(downs) if downs else None,
            "downtime_max_s": max(downs, default=None),
        }
    fell_back = [s for s in swaps if s["fell_back"]]
    bad_swaps = [s for s in swaps if not s["ok"]]
    result.update({"requests": len(records), "failed": len(failed), "cut": len(cut), "unfinished": len(unfinished),
                   "over_bound": len(over),
                   "failed_swaps": len(bad_swaps), "fell_back": len(fell_back), "by_verb": by_verb,
                   "first_failures": [r.error for r in failed[:5]],
                   "over_downtime_max_s": max((s["over_downtime_s"] for s in swaps), default=0.0)})
    what = (f"{result['serve']} ({'simulated host' if result['host'] == 'simulated' else 'this host GPUs ' + result['gpus']})"
            if real else ("the simulator's own server" if result["engine"] == "sim"
                          else f"the simulator playing {result['engine']}"))
    print(f"Caddy {result['caddy']} at {caddy}; {result['concurrency']} streaming clients; {what}; "
          f"switch {result['switch']}, park method {result['park_method']}")
    print("steady, through the front vs straight to the unit (ms):")
    for k in ("ttfb_p50_ms", "ttfb_p99_ms", "e2e_p50_ms", "e2e_p99_ms"):
        a, b = through[k], straight[k]
        print(f"  {k:<12} front {a:8.2f}  direct {b:8.2f}  +{a - b:6.2f} ms  x{a / b:5.3f}")
    print(f"{'swap':<16} {'switch':<12} {'downtime':>9} {'drain':>7} {'hold':>7} {'held':>5} {'longest':>8} "
          f"{'drained':>7} {'cut':>4} {'reqs':>5} {'fail':>4} {'max added':>9} {'bound':>7} {'over dt':>8} "
          f"{'park':>7} {'resume':>7}")
    for s in swaps:
        print(f"{s['verb']:<16} {s['switch'] or s['status'] or '-'!s:<12} {_f(s['downtime_s'], 9)} "
              f"{_f(s['drain_s'], 7)} {_f(s['hold_s'], 7)} {s['held']:5d} {_f(s['longest_hold_s'], 8)} "
              f"{s['drained']:7d} {s['cut']:4d} {s['requests']:5d} {s['failed_requests'] + s['cut_requests']:4d} "
              f"{_f(s['max_added_s'], 9)} {_f(s['bound_s'], 7, 2)} {_f(s['over_downtime_s'], 8)} "
              f"{_f(_timing(s['park'], 'park_s'), 7)} {_f(_timing(s['resume'], 'resume_s'), 7)}")
        if s["fallback"]:
            print(f"  fell back: {s['fallback']}")
    print(f"{'per verb':<16} {'swaps':>5} {'requests':>8} {'failed':>6} {'cut':>4} {'longest hold':>12} "
          f"{'downtime p50':>12} {'max':>8} {'fell back':>9}")
    for kind, t in by_verb.items():
        print(f"{kind:<16} {t['swaps']:5d} {t['requests']:8d} {t['failed']:6d} {t['cut']:4d} "
              f"{_f(t['longest_hold_s'], 12)} {_f(t['downtime_median_s'], 12)} {_f(t['downtime_max_s'], 8)} "
              f"{t['fell_back']:9d}")
    print(f"{len(records)} requests: {len(failed)} failed, {len(cut)} cut, {len(unfinished)} unfinished, "
          f"{len(over)} over their bound; "
          f"the largest added latency over the downtime: {result['over_downtime_max_s']:.3f} s; "
          f"{len(swaps)} of {result['swaps_asked']} swaps run, {len(bad_swaps)} failed, {len(fell_back)} fell back")
    if failed:
        print(f"first failures: {result['first_failures']}")
    if result.get("stopped_early"):
        print(f"stopped early: {result['stopped_early']}")
    return 1 if failed or cut or unfinished or over or bad_swaps or fell_back or result.get("stopped_early") else 0


if __name__ == "__main__":
    sys.exit(main())
