"""``gpuslate bench URL``: load-test an OpenAI-compatible server, level by level."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..errors import UsageError
from .common import add_common, note, print_json
from .exits import ExitStatus

if TYPE_CHECKING:
    from ..bench import BenchResult, LoadPlan, Progress


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench", help="load-test an OpenAI-compatible server (SGLang, vLLM, sim serve)",
        description="Send streamed completions or chat requests to URL at one closed-loop concurrency "
        "level after another (or as Poisson arrivals), and report throughput, TTFT, TPOT, ITL and "
        "end-to-end latency with the definitions of SGLang's bench_serving and vLLM's bench serve "
        "(docs/bench.md).")
    add_common(p)
    p.add_argument("url", metavar="URL", help="the server, e.g. http://127.0.0.1:30000")
    p.add_argument("--concurrency", "-c", default="1", metavar="LIST",
                   help="closed-loop levels, run one after another (default: 1), e.g. 1,2,4,8,16,32,64")
    p.add_argument("--request-rate", type=float, metavar="R",
                   help="Poisson arrivals at R requests/s instead of closed-loop levels")
    p.add_argument("--max-concurrency", type=int, metavar="N",
                   help="with --request-rate: at most N requests in flight")
    p.add_argument("--requests", "-n", type=int, metavar="N",
                   help="requests per level (default: 64, or unlimited with --duration)")
    p.add_argument("--duration", type=float, metavar="SECONDS",
                   help="send requests for SECONDS per level (requests in flight then finish)")
    p.add_argument("--warmup", type=int, default=0, metavar="N",
                   help="requests sent before the first level and left out of the figures")
    p.add_argument("--seed", type=int, default=0, help="seed of prompts and arrivals (default: 0)")
    p.add_argument("--api", choices=("completions", "chat"), default="completions",
                   help="/v1/completions or /v1/chat/completions (default: completions)")
    p.add_argument("--no-stream", dest="stream", action="store_false",
                   help="ask for whole responses (TTFT then equals the end-to-end latency)")
    p.add_argument("--input-len", type=int, default=128, metavar="TOKENS",
                   help="length of the random prompts (default: 128)")
    p.add_argument("--output-len", type=int, default=128, metavar="TOKENS",
                   help="tokens to generate per request (default: 128)")
    p.add_argument("--dataset", metavar="FILE",
                   help="prompts from FILE: JSONL {\"prompt\": ...} lines or ShareGPT JSON")
    p.add_argument("--model", help="model name to send (default: the first of GET /v1/models)")
    p.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                   help="let the model stop early (default: send ignore_eos for exact output lengths)")
    p.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                   help="per-request time limit; a request past it counts as failed (default: 600)")
    p.add_argument("--out", metavar="FILE", help="also write the JSON document to FILE")
    p.set_defaults(handler=run)


def plan_from_args(args: argparse.Namespace) -> LoadPlan:
    """The :class:`LoadPlan` the flags describe; UsageError on a bad combination or value."""
    from ..bench import LoadPlan, parse_levels

    if args.max_concurrency is not None and args.request_rate is None:
        raise UsageError("--max-concurrency needs --request-rate (closed-loop levels set "
                         "their concurrency with --concurrency)")
    requests = args.requests if args.requests is not None else (None if args.duration else 64)
    plan = LoadPlan(
        concurrency=parse_levels(args.concurrency), request_rate=args.request_rate,
        max_concurrency=args.max_concurrency, requests=requests, duration_s=args.duration,
        warmup=args.warmup, seed=args.seed, api=args.api, stream=args.stream,
        input_len=args.input_len, output_len=args.output_len, dataset=args.dataset,
        model=args.model, ignore_eos=args.ignore_eos, timeout_s=args.timeout)
    plan.validate()
    return plan


def run(args: argparse.Namespace) -> int:
    from ..bench.loadgen import normalize_url

    plan = plan_from_args(args)
    normalize_url(args.url)  # a bad URL is a usage error before anything is sent
    if args.out:
        _check_out(args.out)
    bar = _ProgressBar(plan) if sys.stderr.isatty() else None
    try:
        result = asyncio.run(_run_async(args.url, plan, bar.update if bar else None))
    finally:
        if bar is not None:
            bar.close()
    doc = result.to_json()
    if args.out:
        _write_json(Path(args.out), doc)
    if args.json:
        print_json(doc)
    else:
        from .render_bench import print_bench

        print_bench(result)
    if result.interrupted:
        note("interrupted: the figures above are of the requests that finished")
        return ExitStatus.INTERRUPTED
    if not any(lv.completed for lv in result.levels):
        note("error: no request succeeded (the errors are grouped above)")
        return ExitStatus.SERVER_FAILED
    return ExitStatus.OK if result.ok else ExitStatus.PARTIAL


async def _run_async(url: str, plan: LoadPlan,
                     on_progress: Callable[[Progress], None] | None) -> BenchResult:
    from ..bench import run_bench_async

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()

    def interrupt() -> None:
        # First Ctrl-C: finish with what is done. Second: stop at once.
        if stop.is_set() and task is not None:
            task.cancel()
        stop.set()

    loop.add_signal_handler(signal.SIGINT, interrupt)
    try:
        return await run_bench_async(url, plan, on_progress=on_progress, stop=stop)
    except asyncio.CancelledError:
        raise KeyboardInterrupt from None
    finally:
        loop.remove_signal_handler(signal.SIGINT)


def _check_out(path: str) -> None:
    parent = Path(path).parent
    if not parent.is_dir():
        raise UsageError(f"--out {path}: folder {parent} does not exist")
    if Path(path).is_dir():
        raise UsageError(f"--out {path}: is a folder")


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, path)


class _ProgressBar:
    """A rich progress bar on stderr, one task per level."""

    def __init__(self, plan: LoadPlan) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=Console(file=sys.stderr), transient=True)
        self.progress.start()
        self.task: Any = None
        self.key: tuple[int, bool] | None = None

    def update(self, p: Progress) -> None:
        key = (p.level_index, p.warmup)
        if key != self.key:
            if self.task is not None:
                self.progress.remove_task(self.task)
            what = "warm-up" if p.warmup else (
                f"level {p.level_index + 1}/{p.levels} c={p.concurrency}" if p.concurrency
                else "Poisson arrivals")
            self.task = self.progress.add_task(what, total=p.total)
            self.key = key
        self.progress.update(self.task, completed=p.done)

    def close(self) -> None:
        self.progress.stop()
