"""``gpuslate demo [--quick] [--engine NAME] [--out DIR]``: the seed's story end to end, no GPU needed.

On a simulated 8-GPU host (made in a temporary folder, or ``--sim DIR``):

1. a baseline server someone started by hand holds most of each GPU's memory;
2. an experiment clears it (verified), then sweeps two deployments on the same
   GPUs and port, each swapped in on a verified clean slate, declared as the
   engine's own command lines (SGLang by default, the seed's engine:
   ``python -m sglang.launch_server ... --tp-size 8`` and the same with
   ``--speculative-algorithm EAGLE3``, a draft model, 3 steps, topk 1, 4 draft
   tokens; ``--engine vllm|trtllm``: the same story in that engine's form); the
   engines are emulated: stand-ins named like them (``gpuslate.engines.standin``)
   run gpuslate's simulated server with ``--emulate``, which reads their
   arguments by the engine's rules, on a performance model shaped like the
   seed's measurements (baseline saturating near 773 tok/s, EAGLE-3 near 354,
   EAGLE-3 ahead at concurrency 1); then runs the recommendation itself (the
   engine's own files and command) with the deployment that won each level and
   both deployments across the switch (``verify = 1``);
3. the report: tables, plots, where speculation should be switched off, the
   engine's own files and command next to it, and whether the recommendation's
   own run matches the better of the two and holds at the switch; it says
   plainly that the engines were emulated;
4. everything stopped and verified clean (also after Ctrl-C or SIGTERM).

``--quick`` keeps it within a minute on a 2-core machine (36 s measured): short
outputs and few levels; the whole demo sweeps 8 levels up to concurrency 128 in
about 3 minutes there (see :func:`scenario`). The simulated servers run at
``--time-scale 5``: the recommendation uses only output throughput, which a scaled
run preserves (docs/bench.md); the report and the progress lines show the figures
of the modelled system.

Its temporary folder (``gpuslate-demo-*``: the simulated host, unless ``--sim``, and
the units' state) is removed at the end, after an interrupt too, once everything
was verified stopped; otherwise it is kept, and named, so that what is left can be
found (``GPUSLATE_STATE_DIR=... gpuslate ps``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...engines import standin
from ...engines.registry import BACKENDS, SEED_ENGINE
from ...errors import Interrupted, NotDoneError, UsageError
from ...extras import Extra, require
from ..exits import exit_epilog
from ..render.output import Mode, set_mode
from . import present
from .common import add_common, describe, note

if TYPE_CHECKING:
    from ...api import Host

MODEL, DRAFT = "/models/target", "/models/target-eagle3"  # what the engines' command lines name (emulated)
STEPS = 3  # the EAGLE-3 draft length: SGLang's --speculative-num-steps, vLLM's K, TensorRT-LLM's max_draft_len
#: the engines the demo can tell its story in: those the simulator plays
EMULATED = tuple(name for name, e in BACKENDS.items()
                 if e.example(model=MODEL, draft=DRAFT, port=1, gpus=8, steps=STEPS, folder="/") is not None)

MEMORY = "80GiB"  # of the simulated host's 96 GiB per GPU
SWITCHES = ("restart", "park", "auto")  # [experiment] switch (bench/spec.py's Switch)


def build(p: argparse.ArgumentParser) -> None:
    """Its options (the parser is made from its row of the command table, with its summary)."""
    describe(p, examples=[("the whole loop in about a minute: clear, swap, sweep, recommend", "gpuslate demo --quick"),
                         ("the same story told in vLLM's command lines and files", "gpuslate demo --engine vllm "
                          "--out vllm-demo")],
             description="Run the motivating scenario end to end on a simulated 8-GPU host (a temporary "
                       "folder, or --sim DIR): a baseline server holding the GPUs is cleared, then baseline and "
                       "speculative servers are swapped in and swept, and the recommendation (where speculation "
                       "stops paying off) is run and compared with the better of the two. Everything is stopped "
                       "and verified at the end.",
                       epilog=exit_epilog({0: "done, everything stopped and verified clean",
                                           2: "bad --out, or the bench or plots extra not installed "
                                              "(nothing was started)",
                                           4: "not verified clean at the end",
                                           6: "a simulated server failed",
                                           130: "interrupted by Ctrl-C (everything stopped and verified)",
                                           141: "stdout or stderr went away (a closed pipe): likewise",
                                           143: "terminated by SIGTERM (likewise)"}))
    add_common(p, sim_help="run on the simulated host in DIR (default: a new one in a temporary folder, never "
                           "$GPUSLATE_SIM: the demo clears and takes every GPU of its host)")
    p.add_argument("--quick", action="store_true", help="a short sweep (under a minute on 2 cores)")
    p.add_argument("--engine", choices=EMULATED, default=SEED_ENGINE,
                   help=f"the engine whose command lines and files the story is told in (emulated; default "
                   f"{SEED_ENGINE}, the seed's)")
    p.add_argument("--out", metavar="DIR", help="where the experiment and its report go (default: ./gpuslate-demo)")
    p.add_argument("--switch", choices=SWITCHES, default=SWITCHES[0],
                   help="how the deployments give way to one another: restart (default), park (both resident, each "
                   "on its own port, started with its engine's park flag; docs/units.md, Park and resume) or auto")
    p.set_defaults(handler=run)


def scenario(quick: bool, port: int, engine_name: str, work: Path, switch: str = "restart",
             park_port: int | None = None) -> str:
    """The demo's experiment spec (TOML), written next to its results: the engine's own baseline and
    EAGLE-3 command lines (its example, gpuslate.engines), run by stand-ins written into ``work``
    (the files the commands name too) that play the engine on gpuslate's simulated server.

    The whole demo's length is set here: 8 levels x 3 deployments x 2 repeats of 128 requests of
    64 tokens, at 5x, take about 3 minutes on a 2-core machine (was 72 points of 128 tokens at 2x,
    about 25 minutes); --quick 36 points of 32 requests of 32 tokens, about 40 s.

    ``switch`` other than restart: the deployments stay resident and switch by parking, so the
    speculative one serves on ``park_port`` (a parked server keeps its port) and both are started
    with the flag and environment their engine parks with, at its best level (``Engine.park``)."""
    scale = 5
    played = BACKENDS[engine_name]
    ex = played.example(model=MODEL, draft=DRAFT, port=port, gpus=8, steps=STEPS, folder=str(work))
    assert ex is not None  # the --engine choices are the engines with an example
    for name, text in ex.files.items():
        (work / name).write_text(text)
    serve = [sys.executable, "-m", "gpuslate", "sim", "serve", "--emulate", played.name, "--engine-version",
             ex.version, "--memory", MEMORY, "--startup-seconds", "3", "--time-scale", str(scale)]
    env = standin.write(work / "engines", ex.form, serve)
    form = [sys.executable, *ex.form] if ex.form[:1] == ("-m",) else list(ex.form)
    env_toml = "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items()) + " }"

    parks = switch != "restart" and played.park is not None
    if parks and played.park is not None:
        best = played.park.levels[0]
        park_args = (played.park.flag, *((best.needs_flag,) if best.needs_flag else ()))
        env = {**env, **played.park.env}
        env_toml = "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items()) + " }"
    else:
        park_args = ()

    def unit(name: str, args: tuple[str, ...], on: int) -> str:
        argv = [*form, *args, *park_args]
        if on != port:  # its own port: the engine's --port, as it reads it
            argv[len(form) + args.index("--port") + 1] = str(on)
        return (f"[units.{json.dumps(name)}]\ncommand = {json.dumps(argv)}\ngpus = \"0-7\"\n"
                f"port = {on}\nengine = {json.dumps(played.name)}\nstart_timeout = 60\ngrace = 5\n"
                f"stop_timeout = 30\nprefetch = []\nenv = {env_toml}\n")

    levels = [1, 2, 4, 8, 16, 32] if quick else [1, 2, 4, 8, 16, 32, 64, 128]
    load = (f"concurrency = {levels}\nrequests = {32 if quick else 128}\nrepeats = 2\n"
            f"warmup = 4\ninput_len = 64\noutput_len = {32 if quick else 64}\napi = \"completions\"\nseed = 0\n")
    return (f"# gpuslate demo{' --quick' if quick else ''}: {played.title} baseline vs {played.title} EAGLE-3 on a "
            "simulated 8-GPU host (the engine emulated by gpuslate's simulated server)\n\n"
            f"[experiment]\nname = \"demo{'-quick' if quick else ''}\"\n"
            "deployments = [\"baseline\", \"speculative\"]\n"
            "clear = true            # the GPUs are held by a server started by hand: clear them first\n"
            f"time_scale = {scale}          # the simulated servers run {scale}x faster: reports unscale\n"
            "verify = 1              # then run the recommendation itself against the better of the two\n"
            + (f"switch = {json.dumps(switch)}       # both resident, each on its own port: switched by park and "
               "resume\n" if switch != "restart" else "") + "\n"
            "[roles]\nbaseline = \"baseline\"\nspeculative = \"speculative\"\n\n"
            f"[load]\n{load}\n"
            + unit("baseline", ex.baseline, port) + "\n"
            + unit("speculative", ex.speculative, park_port if switch != "restart" and park_port else port))


def run(args: argparse.Namespace) -> int:
    # the simulated servers (sim serve), the load and the report's plots: checked before the
    # simulated host or anything else is started
    require("demo", Extra.BENCH, Extra.PLOTS)
    out = Path(args.out or "gpuslate-demo").absolute()
    _check_out(out)
    t0 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="gpuslate-demo-"))
    clean_box: list[dict[str, Any]] = []  # the clean-slate check, once the demo made it
    try:
        return _demo(args, out, work, t0, clean_box.append)
    finally:
        _remove_work(work, clean_box)


def _remove_work(work: Path, cleans: list[dict[str, Any]]) -> None:
    """The temporary folder goes once everything was verified stopped (an interrupt included);
    else it stays, named: its state folder is how what is left is found and stopped."""
    if cleans and cleans[-1]["ok"]:
        shutil.rmtree(work, ignore_errors=True)
    elif (work / "state").is_dir():
        note(f"kept {work}: what the demo started may still run there "
             f"(GPUSLATE_STATE_DIR={work / 'state'} gpuslate ps)")
    else:  # nothing was started in it
        shutil.rmtree(work, ignore_errors=True)


def _demo(args: argparse.Namespace, out: Path, work: Path, t0: float, checked: Any) -> int:
    from ...api import Host  # lazy: startup
    from ...bench.experiment import run_experiment  # lazy: startup
    from ...bench.report import DemoResult  # lazy: startup
    from ...bench.spec import load_spec  # lazy: startup
    from ...gpu.simhost.host import SimHost  # lazy: startup
    from .experiment import (  # lazy: startup
        ProgressDisplay,
        interrupted_status,
        run_json,
        sigterm_as_interrupt,
        write_report_for,
    )

    sim = getattr(args, "sim", None)
    if sim is None:
        sim = str(SimHost.init(work / "sim", gpus=8, memory=96 * 1024**3, release_delay=0.2).root)
        note(f"simulated 8-GPU host (96 GiB each) in {sim}")
    # the units and servers this demo starts inherit these: they see the simulated host, and
    # their records stay out of the user's own state folder
    os.environ["GPUSLATE_SIM"] = sim
    os.environ["GPUSLATE_STATE_DIR"] = str(work / "state")
    sigterm_as_interrupt()
    if out.exists():
        _remove_previous(out)  # a previous demo's results (checked above)
    out.mkdir(parents=True)
    port, hand_port = _free_port(), _free_port()
    spec_path = work / "demo.toml"  # the results folder keeps a copy (spec.toml)
    spec_path.write_text(scenario(args.quick, port, args.engine, work, args.switch, _free_port()))
    spec = load_spec(spec_path)
    hand = None
    display = ProgressDisplay(spec.time_scale)
    display.say_scale()
    ok = False
    stopped: Interrupted | None = None
    with Host.open(sim, on_event=display.note) as host:  # the demo's one context: the experiment's and the check's
        try:
            hand = _start_by_hand(hand_port, work, display)
            _await_ready(hand, work)
            out.rmdir()  # run_experiment creates it with its manifest
            try:
                result = run_experiment(host, spec, out, on_progress=display.update)
                ok = True
                set_mode(Mode.ACT)  # the sweep ran: the check and the report finish whatever the output does
            except Interrupted as exc:  # the experiment stopped its units; the hint to --resume does not apply
                stopped = exc
        finally:
            display.close()
            clean = _finish(host, hand, interrupted=not ok)
            checked(clean)
    if stopped is not None:
        return interrupted_status(stopped, args.json, f"interrupted; the partial results are in {out}")
    demo = DemoResult(sim, str(out), round(time.monotonic() - t0, 2), clean, run_json(result),
                      write_report_for(out), args.engine)
    return present(args, demo)


def _check_out(out: Path) -> None:
    """Only an empty folder or a previous demo's results may be replaced."""
    if not out.exists():
        if not out.parent.is_dir():
            raise UsageError(f"--out {out}: folder {out.parent} does not exist")
        return
    if not out.is_dir():
        raise UsageError(f"--out {out}: exists and is not a folder")
    if not any(out.iterdir()):
        return
    from ...bench.rundir import read_json  # lazy: startup

    try:
        name = read_json(out / "experiment.json")["spec"]["name"]
    except (OSError, ValueError, KeyError, TypeError):
        name = None
    if name not in ("demo", "demo-quick"):
        raise UsageError(f"--out {out}: exists and does not hold a previous demo", hint="give another --out DIR")


def _remove_previous(out: Path) -> None:
    """Remove the folder ``out`` from inside its parent as the walk reached it (never through another
    user's link on the way; ``out`` itself a link is refused by rmtree), every step by descriptor."""
    from ..._walk import Trust, open_dir  # lazy: startup

    with open_dir(out.parent, trust=Trust.SHARED, what="--out directory") as parent:
        if sys.version_info >= (3, 11):
            shutil.rmtree(out.name, dir_fd=parent.fd)
        else:  # the folder held open, by its descriptor's name
            shutil.rmtree(f"/proc/self/fd/{parent.fd}/{out.name}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_by_hand(port: int, work: Path, display: Any) -> subprocess.Popen[bytes]:
    """A baseline server started by hand (not a unit), holding most of every GPU's memory."""
    display.note(f"a baseline server started by hand holds {MEMORY} on each of the 8 GPUs (port {port})")
    log = work / "hand-started-baseline.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "gpuslate", "sim", "serve", "--port", str(port),
                                 "--memory", MEMORY, "--startup-seconds", "0"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=f,
                                start_new_session=True)
    return proc


def _await_ready(proc: subprocess.Popen[bytes], work: Path) -> None:
    """Until its log shows SGLang's readiness line (apart from starting it, so that an interrupt
    while waiting still finds the process to stop)."""
    log = work / "hand-started-baseline.log"
    deadline = time.monotonic() + 30
    while b"ready to roll" not in log.read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise NotDoneError(f"the demo's hand-started baseline server did not start (see {log})")
        time.sleep(0.02)


def _finish(host: Host, hand: subprocess.Popen[bytes] | None, *, interrupted: bool) -> dict[str, Any]:
    """Stop what the demo itself started (the hand-started server, if the experiment did not clear it),
    then verify on ``host``: every GPU free, no unit running."""
    from ...options import WaitOptions  # lazy: startup

    if hand is not None and hand.poll() is None:
        try:
            os.killpg(hand.pid, signal.SIGTERM)  # its own session and group: only what it started
        except ProcessLookupError:
            pass
        try:
            hand.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(hand.pid, signal.SIGKILL)
            hand.wait()
    elif hand is not None:
        hand.wait()
    free = host.wait(None, WaitOptions(timeout=30))
    units = [u for u in host.ps().units if u.state in ("starting", "ready", "orphaned")]
    busy = [r.index for r in free.readings if r.processes or r.memory is None or r.memory.used > free.max_used]
    doc = {"ok": free.ok and not units, "gpus": len(free.gpus), "gpus_free": len(free.gpus) - len(busy),
           "units_running": len(units), "interrupted": interrupted}
    if not doc["ok"]:
        note(f"error: not clean after the demo: {doc}")
    elif interrupted:
        note(f"interrupted: everything stopped; {doc['gpus_free']}/{doc['gpus']} GPUs verified free")
    return doc
