"""``gpuslate bench URL``: load-test an OpenAI-compatible server, level by level.

Ctrl-C and SIGTERM end a run at any point (the model probe included): what
finished is printed, what was in flight listed, ``--out`` written, and the
exit status is 130 or 143.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..._document import parse_json
from ...errors import BadDocument, UsageError
from ...extras import Extra, require
from ..exits import ExitStatus, exit_epilog
from . import present
from .common import describe, note, positive_duration

if TYPE_CHECKING:
    from ...bench import BenchResult, LoadPlan, Progress

EPILOG = exit_epilog({
    0: "every level completed and no request failed",
    2: "bad input, or the bench extra (aiohttp) not installed (nothing was sent)",
    6: "the server cannot be reached, refused the API key, or no request succeeded",
    7: "partial: some requests failed or a level stopped early (the server went away)",
    130: "interrupted by Ctrl-C (what finished is printed and --out written)",
    143: "terminated by SIGTERM (likewise)"}, backend=False)


def add_json(p: argparse.ArgumentParser) -> None:
    """--json only: a load test has no GPU backend, so no --sim."""
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                   help="print the versioned JSON document instead of a table")


def build(p: argparse.ArgumentParser) -> None:
    """Its options (the parser is made from its row of the command table, with its summary)."""
    describe(p, examples=[
        ("closed-loop levels of 1 to 64 requests in flight, 200 requests each",
         "gpuslate bench http://127.0.0.1:30000 -c 1,4,16,64 -n 200"),
        ("Poisson arrivals at 8 requests/s for 2 minutes, the JSON kept",
         "gpuslate bench http://127.0.0.1:30000 --request-rate 8 --duration 2m --out run.json"),
        ("chat requests of 1024 tokens in, 256 out, with goodput against SLOs in ms",
         "gpuslate bench http://127.0.0.1:8000 --api chat --input-len 1024 --output-len 256 "
         "--goodput ttft:500,tpot:50")],
             description="Send streamed completions or chat requests to URL at one closed-loop concurrency "
        "level after another (or as Poisson/gamma arrivals), and report throughput, TTFT, TPOT, ITL and "
        "end-to-end latency with the definitions of SGLang's bench_serving and vLLM's bench serve "
        "(docs/bench.md).", epilog=EPILOG)
    add_json(p)
    p.add_argument("url", metavar="URL", help="the server, e.g. http://127.0.0.1:30000")
    p.add_argument("--concurrency", "-c", default="1", metavar="LIST",
                   help="closed-loop levels, run one after another (default: 1), e.g. 1,2,4,8,16,32,64")
    p.add_argument("--request-rate", type=_rate, metavar="R",
                   help="arrivals at R requests/s instead of closed-loop levels; inf: all at once")
    p.add_argument("--burstiness", type=float, default=1.0, metavar="B",
                   help="with --request-rate: gamma-distributed gaps of shape B (1: Poisson, the default; "
                   "< 1 burstier, > 1 steadier), as vLLM's --burstiness")
    p.add_argument("--max-concurrency", type=int, metavar="N",
                   help="with --request-rate: at most N requests in flight")
    p.add_argument("--requests", "-n", type=int, metavar="N",
                   help="requests per level (default: 64, or unlimited with --duration)")
    p.add_argument("--duration", type=positive_duration, metavar="DURATION",
                   help="send requests for DURATION per level, e.g. 60 or 2m (requests in flight then finish)")
    p.add_argument("--warmup", type=int, default=0, metavar="N",
                   help="requests sent before each level at its concurrency, left out of the figures "
                   "(default: 0)")
    p.add_argument("--warmup-first-only", action="store_true",
                   help="warm up before the first level only")
    p.add_argument("--seed", type=int, default=0, help="seed of prompts and arrivals (default: 0)")
    p.add_argument("--api", choices=("completions", "chat"), default="completions",
                   help="/v1/completions or /v1/chat/completions (default: completions)")
    p.add_argument("--no-stream", dest="stream", action="store_false",
                   help="ask for whole responses (TTFT then equals the end-to-end latency)")
    p.add_argument("--input-len", type=int, default=128, metavar="TOKENS",
                   help="length of the random prompts (default: 128)")
    p.add_argument("--output-len", type=int, default=128, metavar="TOKENS",
                   help="tokens to generate per request (default: 128)")
    p.add_argument("--random-range-ratio", type=float, default=0.0, metavar="R",
                   help="random input and output lengths uniform within L*(1-R)..L*(1+R) (vLLM's meaning; "
                   "default: 0, exact lengths)")
    p.add_argument("--dataset", metavar="FILE",
                   help="prompts from FILE: JSONL {\"prompt\": ...} lines or ShareGPT JSON")
    p.add_argument("--model", help="model name to send (default: the first of GET /v1/models)")
    p.add_argument("--tokenizer", metavar="NAME_OR_PATH",
                   help="count tokens with this tokenizer when the server reports no usage: a tokenizer.json, "
                   "a folder with one, or a model in the local Hugging Face cache (nothing is downloaded)")
    p.add_argument("--api-key", metavar="KEY", default=os.environ.get("OPENAI_API_KEY") or None,
                   help="send 'Authorization: Bearer KEY' (default: $OPENAI_API_KEY)")
    p.add_argument("--header", action="append", default=[], metavar="NAME:VALUE",
                   help="an extra HTTP header on every request (repeatable)")
    p.add_argument("--extra-body", metavar="JSON",
                   help="a JSON object merged into every request body, e.g. '{\"top_p\": 0.9}'")
    p.add_argument("--goodput", metavar="SLOS",
                   help="service-level objectives in ms, e.g. ttft:500,tpot:50,e2e:10000: goodput is the "
                   "requests/s that met all of them (vLLM's --goodput)")
    p.add_argument("--percentiles", default="50,90,95,99", metavar="LIST",
                   help="latency percentiles in the JSON (default: 50,90,95,99; the median is always there)")
    p.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                   help="let the model stop early (default: send ignore_eos for exact output lengths)")
    p.add_argument("--connection", choices=("pooled", "per-request"), default="pooled",
                   help="pooled (the default): reuse keep-alive connections, as vLLM's bench serve; per-request: "
                   "a new connection for every request, its set-up inside TTFT and E2E, as SGLang's bench_serving")
    p.add_argument("--timeout", type=positive_duration, default=600.0, metavar="DURATION",
                   help="per-request time limit; a request past it counts as failed (default: 600s, 10m)")
    p.add_argument("--out", metavar="FILE", help="also write the JSON document to FILE")
    p.set_defaults(handler=run)


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid rate {text!r}: a number of requests/s, or inf") from None
    return value


def parse_goodput(text: str) -> tuple[tuple[Any, float], ...]:
    """``ttft:500,tpot:50`` -> ((Slo.TTFT, 500.0), (Slo.TPOT, 50.0)); UsageError naming the bad item."""
    from ...bench.metrics import Slo  # lazy: startup

    out: dict[Any, float] = {}
    for item in text.split(","):
        name, sep, value = item.strip().partition(":")
        try:
            key = Slo(name.strip().lower().replace("e2el", "e2e"))
            ms = float(value)
        except ValueError:
            raise UsageError(f"invalid --goodput item {item.strip()!r}: expected ttft:MS, tpot:MS or e2e:MS") \
                from None
        if not sep or not math.isfinite(ms) or ms <= 0:
            raise UsageError(f"invalid --goodput item {item.strip()!r}: the limit must be a number of ms > 0")
        out[key] = ms
    return tuple(out.items())


def parse_percentiles(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(t) for t in text.split(","))
    except ValueError:
        raise UsageError(f"invalid --percentiles {text!r}: expected numbers, e.g. 50,90,99") from None
    if not values or any(not 0 <= v <= 100 for v in values):
        raise UsageError(f"invalid --percentiles {text!r}: each must be within 0..100")
    return values


def _headers(items: list[str]) -> tuple[tuple[str, str], ...]:
    out = []
    for item in items:
        name, sep, value = item.partition(":")
        if not sep or not name.strip():
            raise UsageError(f"invalid --header {item!r}: expected NAME:VALUE")
        out.append((name.strip(), value.strip()))
    return tuple(out)


def _extra_body(text: str | None) -> dict[str, Any]:
    if text is None:
        return {}
    try:  # bounded like every document gpuslate parses: no RecursionError for '[[[[...'
        doc = parse_json(text)
    except BadDocument as exc:
        raise UsageError(f"invalid --extra-body: {exc}") from None
    if not isinstance(doc, dict):
        raise UsageError("invalid --extra-body: expected a JSON object, e.g. '{\"top_p\": 0.9}'")
    return doc


def plan_from_args(args: argparse.Namespace) -> LoadPlan:
    """The :class:`LoadPlan` the flags describe; UsageError on a bad combination or value."""
    from ...bench import LoadPlan, parse_levels  # lazy: startup

    if args.max_concurrency is not None and args.request_rate is None:
        raise UsageError("--max-concurrency needs --request-rate (closed-loop levels set "
                         "their concurrency with --concurrency)")
    if args.burstiness != 1.0 and args.request_rate is None:
        raise UsageError("--burstiness needs --request-rate")
    requests = args.requests if args.requests is not None else (None if args.duration else 64)
    plan = LoadPlan(
        concurrency=parse_levels(args.concurrency), request_rate=args.request_rate,
        max_concurrency=args.max_concurrency, requests=requests, duration_s=args.duration,
        warmup=args.warmup, warmup_each_level=not args.warmup_first_only, seed=args.seed, api=args.api,
        stream=args.stream, input_len=args.input_len, output_len=args.output_len, dataset=args.dataset,
        model=args.model, ignore_eos=args.ignore_eos, timeout_s=args.timeout, burstiness=args.burstiness,
        random_range_ratio=args.random_range_ratio, percentiles=parse_percentiles(args.percentiles),
        goodput=parse_goodput(args.goodput) if args.goodput else (), extra_body=_extra_body(args.extra_body),
        headers=_headers(args.header), api_key=args.api_key, tokenizer=args.tokenizer, connection=args.connection)
    plan.validate()
    return plan


def run(args: argparse.Namespace) -> int:
    require("bench", Extra.BENCH)  # before the load generator (and aiohttp) is imported
    from ...bench.loadgen import run_loop  # lazy: startup (and aiohttp)
    from ...bench.plan import normalize_url  # lazy: startup
    from ...bench.result import BenchStatus  # lazy: startup

    plan = plan_from_args(args)
    normalize_url(args.url)  # a bad URL is a usage error before anything is sent
    if args.out:
        _check_out(args.out)
    if plan.tokenizer:
        from ...bench.tokens import resolve_tokenizer_file  # lazy: startup

        require("bench --tokenizer", Extra.TOKENIZERS)  # exit 2 before anything is sent
        resolve_tokenizer_file(plan.tokenizer)
    bar = _ProgressBar() if sys.stderr.isatty() else None
    signals: list[int] = []
    try:
        result = run_loop(_run_async(args.url, plan, bar.update if bar else None, signals))
    finally:
        if bar is not None:
            bar.close()
    doc = result.to_json()
    if args.out:
        _write_json(Path(args.out), doc)
    for warning in result.warnings:
        note(f"warning: {warning}")
    if any(lv.tokens_estimated for lv in result.levels):
        note("warning: the server reported no usage: token counts and token throughputs are ESTIMATED "
             "(~4 characters a token); give --tokenizer NAME_OR_PATH for exact counts")
    for lv in result.levels:
        if lv.warming:
            note(f"warning: level {_label(lv)}: its first requests were much slower than the rest; the server "
                 "was still warming up at this concurrency (use --warmup N)")
        if lv.stopped_early:
            note(f"level {_label(lv)} stopped early: {lv.stopped_early}; {lv.not_sent} request(s) not sent")
    shown = present(args, result)
    status = result.status
    if status == BenchStatus.INTERRUPTED:
        what = "terminated" if signals and signals[-1] == signal.SIGTERM else "interrupted"
        note(f"{what}: the figures above are of the requests that finished"
             + (f"; {len(result.in_flight)} request(s) were in flight and abandoned" if result.in_flight else "")
             + (f"; written to {args.out}" if args.out else ""))
        if what == "terminated":  # the result does not know which signal: SIGTERM's own code
            return ExitStatus.TERMINATED
    elif status == BenchStatus.FAILED:
        note("error: no request succeeded (the errors are grouped above)")
    return shown


def _label(lv: Any) -> str:
    return f"c={lv.concurrency}" if lv.concurrency is not None else f"rate {lv.request_rate:g}/s"


async def _run_async(url: str, plan: LoadPlan, on_progress: Callable[[Progress], None] | None,
                     signals: list[int]) -> BenchResult:
    from ...bench import run_bench_async  # lazy: startup

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()

    def interrupt(signum: int) -> None:
        # First Ctrl-C or SIGTERM: finish with what is done. A second: stop at once.
        signals.append(signum)
        if stop.is_set() and task is not None:
            task.cancel()
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, interrupt, sig)
    try:
        return await run_bench_async(url, plan, on_progress=on_progress, stop=stop)
    except asyncio.CancelledError:
        raise KeyboardInterrupt from None
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def _check_out(path: str) -> None:
    parent = Path(path).parent
    if not parent.is_dir():
        raise UsageError(f"--out {path}: folder {parent} does not exist")
    if Path(path).is_dir():
        raise UsageError(f"--out {path}: is a folder")


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    """--out FILE: atomically, its folder walked (never another user's link: gpuslate/_walk.py)."""
    from ..._walk import write_file  # lazy: startup

    write_file(path, (json.dumps(doc, indent=2) + "\n").encode(), what="--out directory")


def _count(done: int, total: int | None) -> str:
    """Requests done, of how many where that is known (a level bounded by time has no total)."""
    return f"{done}/{total}" if total is not None else f"{done} done"


class _ProgressBar:
    """A rich progress bar on stderr, one task per level."""

    def __init__(self) -> None:
        from rich.console import Console  # lazy: startup
        from rich.progress import (  # lazy: startup
            BarColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        # "12/64" of a level of -n requests; "36 done" of one bounded by --duration, whose total no one
        # knows (never "36/?")
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[count]}"),
                                 TimeElapsedColumn(), console=Console(file=sys.stderr), transient=True)
        self.progress.start()
        self.task: Any = None
        self.key: tuple[int, bool] | None = None

    def update(self, p: Progress) -> None:
        key = (p.level_index, p.warmup)
        if key != self.key:
            if self.task is not None:
                self.progress.remove_task(self.task)
            what = f"level {p.level_index + 1}/{p.levels} " + (
                f"c={p.concurrency}" if p.concurrency else "arrivals") + (" warm-up" if p.warmup else "")
            self.task = self.progress.add_task(what, total=p.total, count="")
            self.key = key
        self.progress.update(self.task, completed=p.done, count=_count(p.done, p.total))

    def close(self) -> None:
        self.progress.stop()
