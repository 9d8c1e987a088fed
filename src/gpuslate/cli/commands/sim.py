"""``gpuslate sim``: create and drive simulated GPU hosts."""

from __future__ import annotations

import argparse
import os
import sys

from ..._parse import format_gpu_list, format_size, parse_gpu_list, selected_gpus
from ...errors import UsageError
from ...extras import Extra, require
from ...gpu import sim_root_from_env
from ..exits import ExitStatus, exit_epilog
from . import present
from .common import add_common, describe, duration, gpu_list, gpus_arg, note, size, whole, with_examples


def build(p: argparse.ArgumentParser) -> None:
    """Its options (the parser is made from its row of the command table, with its summary)."""
    describe(p, examples=[("a simulated 8-GPU host of your own, then a job holding 40 GiB on each GPU",
                          "gpuslate sim init /tmp/gpus"),
                         ("", "gpuslate --sim /tmp/gpus sim hold --memory 40GiB --workers 8")],
             description="Simulated GPUs for machines without GPUs (demo, CI, dry runs). "
                       "Memory is held by real processes and discovered like real devices.",
                       epilog=exit_epilog({2: "bad input, or no SUBCOMMAND"}, backend=False))
    add_common(p)
    ss = p.add_subparsers(dest="sim_command", metavar="SUBCOMMAND", parser_class=type(p))
    p.set_defaults(handler=_no_subcommand)

    init = ss.add_parser("init", help="create (or reset) a simulated host in DIR",
                         description="Create a simulated GPU host in the folder DIR (or reset the one there: "
                         "its holders' records and leaks are forgotten). Point gpuslate at it with --sim DIR "
                         "or GPUSLATE_SIM=DIR. The folder is DIR: a --sim naming another folder is refused.",
                         epilog=exit_epilog({2: "bad input, DIR is neither empty nor a simulated host, or --sim "
                                             "names another folder",
                                             5: "DIR, its alloc/ or dev/ is another user's, or reached through "
                                             "another user's link (nothing is reset)"},
                                            backend=False))
    init.epilog = with_examples([
        ("a simulated 8-GPU host in /tmp/gpus; gpuslate uses it with --sim or $GPUSLATE_SIM",
         "gpuslate sim init /tmp/gpus"),
        ("4 H200-like GPUs, reporting like a driver before R510",
         "gpuslate sim init /tmp/h200 --count 4 --memory 143771MiB --memory-api v1")], init.epilog)
    add_common(init)
    init.add_argument("dir", metavar="DIR", help="the folder of the simulated host (created if missing)")
    init.add_argument("--count", type=whole(1, 64), default=8, metavar="N", help="number of GPUs, 1 to 64 (default 8)")
    # --gpus is a GPU *list* everywhere else; kept, hidden, for scripts written before --count
    init.add_argument("--gpus", dest="count", type=whole(1, 64), help=argparse.SUPPRESS)
    init.add_argument("--memory", type=size, default="97887MiB", metavar="SIZE",
                      help="memory per GPU (default 97887MiB, an RTX PRO 6000 Blackwell)")
    init.add_argument("--reserved", type=size, default=None, metavar="SIZE",
                      help="driver-reserved memory per GPU (default 0; with --memory-api v1, 645MB like an "
                      "idle H200)")
    init.add_argument("--memory-api", choices=("v2", "v1"), default="v2",
                      help="the NVML memory API the simulated driver has: v2 reports reserved memory apart "
                      "from 'used'; v1 (drivers before R510) counts it as used (default v2)")
    init.add_argument("--name", default="NVIDIA RTX PRO 6000 Blackwell", metavar="NAME", help="GPU model name")
    init.add_argument("--release-delay", type=duration, default=0.2, metavar="DURATION",
                      help="time the simulated driver takes to release a dead holder's memory (default 0.2s)")
    init.add_argument("--host-memory", type=size, default="2TiB", metavar="SIZE",
                      help="the host's memory, where a sleeping engine's weights and the driver's checkpoints go "
                      "(default 2TiB, an 8-GPU H200 node)")
    init.set_defaults(handler=run_init)

    hold = ss.add_parser("hold", help="hold simulated GPU memory until killed",
                         description="Hold memory on simulated GPUs with real processes until killed. "
                         "Prints one JSON line {\"ready\": true, \"pid\": ..., \"workers\": [...]} when held "
                         "(pids as the holder's /proc shows them; status shows host pids). Like a driver, a GPU never "
                         "holds more than its memory: asking for more fails (simulated CUDA out of memory).",
                         epilog=exit_epilog({0: "ended by SIGTERM (after it was ready)",
                                             130: "ended by SIGINT (Ctrl-C)",
                                             2: "bad input, or no simulated host",
                                             5: "this user may not record memory in the host's folder",
                                             6: "out of memory: a GPU lacks the room (nothing is held)"}))
    hold.epilog = with_examples([
        ("a job of 8 workers holding 40 GiB each, left behind by its launcher as SGLang's are",
         "gpuslate --sim /tmp/gpus sim hold --memory 40GiB --workers 8 --orphan-workers --title "
         "'sglang::scheduler_TP{rank}'"),
        ("a monitor: GPU 0 opened, no memory held",
         "gpuslate --sim /tmp/gpus sim hold --gpus 0 --memory 0")], hold.epilog)
    add_common(hold)
    hold.add_argument("--gpus", type=gpus_arg, metavar="LIST", help="GPUs to hold, e.g. 0,2-3 or all (default: all)")
    hold.add_argument("--memory", type=size, required=True, metavar="SIZE",
                      help="memory held on each listed GPU, e.g. 40GiB; 0 holds the device open only")
    hold.add_argument("--workers", type=whole(0, 256), default=0, metavar="N",
                      help="the launcher holds nothing and spawns N workers holding memory round-robin")
    hold.add_argument("--orphan-workers", action="store_true",
                      help="workers double-fork away from the launcher (reparented to PID 1)")
    hold.add_argument("--ignore-term", action="store_true",
                      help="every process ignores SIGTERM (SIG_IGN: visible in /proc, so clear SIGKILLs it early)")
    hold.add_argument("--survive-term", action="store_true",
                      help="every process catches SIGTERM and carries on (only the grace period ends it)")
    hold.add_argument("--handles", type=gpu_list, metavar="LIST",
                      help="also hold a device handle (no memory) on these GPUs, as CUDA opens every device")
    hold.add_argument("--title", metavar="NAME",
                      help="process title, e.g. sglang::scheduler_TP{rank} ({rank}: the worker number)")
    hold.add_argument("--no-reap", action="store_true",
                      help="the launcher never collects dead workers (they stay zombies)")
    hold.add_argument("--mps", action="store_true",
                      help="hold the memory as CUDA MPS clients (listed as MPS contexts, kind mps); needs a "
                      "simulated MPS server of this user on each GPU ('gpuslate sim mps')")
    hold.add_argument("--ipc", action="store_true",
                      help="the memory is shared with other processes through CUDA IPC, as tensor-parallel ranks "
                      "share buffers: the driver's checkpoint refuses such a process")
    hold.add_argument("--main-thread-exits", action="store_true",
                      help="once it holds, each holder's main thread exits (pthread_exit) and another thread "
                      "keeps the memory: /proc says Z for a process that lives")
    hold.set_defaults(handler=run_hold)

    mps = ss.add_parser("mps", help="a simulated CUDA MPS server, holding its footprint until killed",
                        description="Run a simulated CUDA MPS server (nvidia-cuda-mps-server) until killed: it "
                        "holds FOOTPRINT on each listed GPU as a compute context, as a real idle server does "
                        "(66 MiB on an H200), and runs as DIR/bin/nvidia-cuda-mps-server, a copy of the "
                        "system's sleep, started by a simulated control daemon (DIR/bin/nvidia-cuda-mps-control). "
                        "It is a GPU daemon (spared by clear, its memory a baseline that wait and clear do not "
                        "count) when those copies are root's, as when root runs this; for another user it is an "
                        "ordinary process of theirs. 'sim hold --mps' starts its clients. Prints one JSON line "
                        "{\"ready\": true, \"pid\": ..., \"control\": ..., \"workers\": []} when held.",
                        epilog=exit_epilog({0: "the server ended (SIGTERM or SIGINT to this command ends it)",
                                            2: "bad input, or no simulated host",
                                            5: "this user may not record memory in the host's folder, or "
                                            "DIR/bin is not this user's own",
                                            6: "out of memory: a GPU lacks the room (nothing is held)"}))
    mps.epilog = with_examples([
        ("an MPS server on GPUs 0-1 (its clients: sim hold --mps)",
         "gpuslate --sim /tmp/gpus sim mps --gpus 0-1")], mps.epilog)
    add_common(mps)
    mps.add_argument("--gpus", type=gpus_arg, metavar="LIST", help="GPUs the server serves (default: all)")
    mps.add_argument("--footprint", type=size, default="66MiB", metavar="SIZE",
                     help="memory the server holds on each GPU (default 66MiB, an idle server on an H200)")
    mps.set_defaults(handler=run_mps)

    serve = ss.add_parser("serve", help="a simulated OpenAI-compatible inference server",
                          description="A simulated OpenAI-compatible inference server (SGLang- and vLLM-like "
                          "endpoints) generating tokens on a documented performance model of continuous "
                          "batching; its workers hold simulated GPU memory. See docs/sim-server.md.",
                          epilog=exit_epilog({0: "ended by SIGTERM", 130: "ended by SIGINT (Ctrl-C)",
                                              2: "bad input (its port in use), or the bench extra (aiohttp) "
                                              "not installed: nothing started",
                                              1: "its simulated startup failed (--fail-startup), as an "
                                              "engine's crash exits",
                                              6: "its workers could not hold their memory (a GPU lacks the "
                                              "room: simulated CUDA out of memory)"}))
    serve.epilog = with_examples([
        ("an SGLang-like server on port 30000, its 2 workers holding 20 GiB each on GPUs 0-1",
         "gpuslate --sim /tmp/gpus sim serve --port 30000 --gpus 0-1 --memory 20GiB"),
        ("vLLM's own arguments, read by vLLM's rules; loading takes 2 s",
         "gpuslate sim serve --port 8000 --startup-seconds 2s --emulate vllm -- --model m "
         "--tensor-parallel-size 2")], serve.epilog)
    serve.lazy_build = _serve_options  # type: ignore[attr-defined]
    serve.set_defaults(handler=run_serve)

    leak = ss.add_parser("leak", help="leave memory held by no process (an orphaned context)",
                         description="Leave SIZE of memory on simulated GPU N held by no process, like an "
                         "orphaned CUDA context, until the next 'gpuslate sim init' of the host: what "
                         "'clear' and 'wait' must diagnose rather than wait out.",
                         epilog=exit_epilog({2: "bad input, or no simulated host",
                                             5: "this user may not record memory in the host's folder",
                                             6: "out of memory: the GPU lacks the room"}))
    leak.epilog = with_examples([
        ("2 GiB on GPU 3 held by no process (a leaked context)",
         "gpuslate --sim /tmp/gpus sim leak --gpu 3 --memory 2GiB")], leak.epilog)
    add_common(leak)
    leak.add_argument("--gpu", type=whole(0, 1023), required=True, metavar="N", help="the GPU index")
    leak.add_argument("--memory", type=size, required=True, metavar="SIZE", help="memory left held, e.g. 2GiB")
    leak.set_defaults(handler=run_leak)


def _no_subcommand(args: argparse.Namespace) -> int:
    raise UsageError("gpuslate sim needs a SUBCOMMAND: init, hold, mps, leak or serve (see 'gpuslate sim --help')")


def _serve_options(serve: argparse.ArgumentParser) -> None:
    add_common(serve)
    from ...simserver.serverconfig import add_arguments  # lazy: startup

    add_arguments(serve)
    serve.add_argument("--gpus", type=gpus_arg, metavar="LIST",
                       help="simulated GPUs the workers hold, e.g. 0-1 or all (default: $CUDA_VISIBLE_DEVICES, "
                       "else all)")
    serve.add_argument("--workers", type=whole(0, 256), default=None, metavar="N",
                       help="worker processes, one per GPU like tensor-parallel ranks (default: one per GPU; "
                       "0 without a simulated host)")
    serve.add_argument("--memory", type=size, default="20GiB", metavar="SIZE",
                       help="memory each GPU holds while the server runs (default 20GiB)")
    serve.add_argument("--title", default="sglang::scheduler_TP{rank}", metavar="NAME",
                       help="worker process title ({rank}: the worker number)")


def _host(args: argparse.Namespace):  # -> SimHost
    from ...gpu.simhost.host import SimHost  # lazy: startup

    root = getattr(args, "sim", None) or sim_root_from_env()
    if not root:
        raise UsageError("no simulated host: pass --sim DIR or set GPUSLATE_SIM=DIR "
                         "(create one with 'gpuslate sim init DIR')")
    host = SimHost(root)
    host.config  # noqa: B018 - a clear error now if DIR is no simulated host
    return host


def run_init(args: argparse.Namespace) -> int:
    from ...gpu.simhost.host import SimHost  # lazy: startup
    from ...gpu.simhost.results import SimInitResult  # lazy: startup

    # one meaning: the folder is DIR; a --sim naming another one is a mistake, not a second target
    if getattr(args, "sim", None) and os.path.abspath(args.sim) != os.path.abspath(args.dir):
        raise UsageError(f"sim init creates the host in DIR ({args.dir}); --sim names another folder "
                         f"({args.sim}): drop --sim or pass the same folder")
    host = SimHost.init(args.dir, gpus=args.count, memory=args.memory, name=args.name,
                        release_delay=args.release_delay, reserved=args.reserved, memory_api=args.memory_api,
                        host_memory=args.host_memory)
    result = SimInitResult.of(host)
    return present(args, result)


def run_hold(args: argparse.Namespace) -> int:
    from ...gpu.simhost.holder import full_titles, hold  # lazy: startup

    host = _host(args)
    if args.title and not full_titles():
        note("setproctitle is not installed: --title sets only the kernel's process name (15 characters), "
             "not the command line (pip install setproctitle)")
    gpus = selected_gpus(args.gpus)
    gpus = gpus if gpus is not None else list(range(host.gpu_count))
    hold(host, gpus, args.memory, workers=args.workers, orphan_workers=args.orphan_workers,
         ignore_term=args.ignore_term, survive_term=args.survive_term, handles=args.handles, title=args.title,
         reap=not args.no_reap, mps=args.mps, main_thread_exits=args.main_thread_exits, ipc=args.ipc)


def run_mps(args: argparse.Namespace) -> int:
    from ...gpu.simhost.holder import mps_server  # lazy: startup

    host = _host(args)
    gpus = selected_gpus(args.gpus)
    mps_server(host, gpus if gpus is not None else list(range(host.gpu_count)), args.footprint)
    return ExitStatus.OK


def run_leak(args: argparse.Namespace) -> int:
    from ...gpu.simhost.results import SimLeakResult  # lazy: startup

    host = _host(args)
    result = SimLeakResult(args.gpu, args.memory, str(host.leak(args.gpu, args.memory)))
    return present(args, result)


def run_serve(args: argparse.Namespace) -> int:
    import signal  # lazy: startup

    require("sim serve", Extra.BENCH)  # the HTTP server is aiohttp's
    from ...simserver.server import LOG_PREFIX, config_from_args, run_server  # lazy: startup

    try:
        config = config_from_args(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    root = getattr(args, "sim", None) or sim_root_from_env()
    workers: list[int] = []  # in this process's PID namespace: what it may signal
    started: list = []  # the workers (WorkerPid), with their control lines when the engine parks
    shown: list[int] = []  # their pids as the host shows them: what the driver's checkpoint names
    # an engine that parks holds its memory as the engine's tagged regions (simserver/parkmodel.py)
    park = config.engine_park
    parks = park is not None and park.park.flag in park.flags

    def start() -> list[int]:
        if not root:
            if args.workers:
                raise UsageError("--workers needs a simulated host: pass --sim DIR or set GPUSLATE_SIM")
            return []
        from ...gpu.simhost.holder import start_workers  # lazy: startup

        host = _host(args)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        gpus = args.gpus if isinstance(args.gpus, list) else (  # all, or else $CUDA_VISIBLE_DEVICES
            parse_gpu_list(visible) if visible and args.gpus is None else list(range(host.gpu_count)))
        n = len(gpus) if args.workers is None else args.workers
        if n < 0 or n > 256:
            raise UsageError(f"invalid --workers {n}: 0 to 256")
        from ...simserver.parkmodel import REGIONS  # lazy: startup

        # several ranks share buffers through CUDA IPC (custom all-reduce), as a tensor-parallel server's do
        started.extend(start_workers(host, gpus, args.memory, n, title=args.title, ipc=n > 1,
                                     regions=REGIONS if parks else None) if n else [])
        workers.extend(w.own for w in started)
        shown.extend(w.shown for w in started)
        # said once, on stderr like every log line: a bare `sim serve` takes every GPU of the host
        where = ("--gpus" if args.gpus is not None else "CUDA_VISIBLE_DEVICES" if visible
                 else "no --gpus and no CUDA_VISIBLE_DEVICES: every GPU of the host")
        sys.stderr.write(f"{LOG_PREFIX} {n} worker{'s' if n != 1 else ''} hold {format_size(args.memory)} on "
                         f"each of GPUs {format_gpu_list(gpus)} ({where})\n" if n else
                         f"{LOG_PREFIX} no workers: no simulated GPU memory held (--workers 0)\n")
        sys.stderr.flush()
        return [w.shown for w in started]

    def memory():  # -> WorkerControls | None, once the workers run
        if not parks or not started:
            return None
        from ...gpu.simhost.holder import WorkerControls  # lazy: startup

        return WorkerControls(started)

    seen: list = []  # the host, opened once for the look every LOCK_POLL_SECONDS

    def gpu_locked() -> bool:  # the driver holds a worker locked or checkpointed: its GPU work waits
        if not shown:
            return False
        if not seen:
            seen.append(_host(args))
        entries = seen[0].checkpoint_entries()
        return any(pid in entries for pid in shown)

    def dead_worker() -> int | None:  # one of its workers has exited: looked at, never reaped (WNOWAIT)
        for pid in workers:
            try:
                if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                    return pid
            except ChildProcessError:
                return pid
        return None

    try:
        return ExitStatus(run_server(config, start_workers=start, memory=memory,
                                     gpu_locked=gpu_locked if root else None, dead_worker=dead_worker))
    finally:
        # like a real server's shutdown: its ranks go with it (a SIGKILLed
        # launcher cannot do this, which is how orphaned workers happen). They are
        # our children, never reaped before this: their pids cannot have been reused
        for pid in workers:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
