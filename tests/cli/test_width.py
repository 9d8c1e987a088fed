"""Every table the CLI prints, on terminals of 60, 80 and 120 columns: no line wider than the
terminal and no key column cut (every row still says its PID, user, GPUs, memory, level or unit),
the command given the width that is left; piped, nothing cut.

The commands run in this process, as ``gpuslate`` runs them (``cli.main.main``), against a
simulated host and real processes, with stdout a terminal (an ``isatty`` stream whose size cannot
be asked) of ``$COLUMNS`` columns, as gpuslate's plain tables and rich both take it. bench's and an
experiment's tables are rendered from their results."""

from __future__ import annotations

import getpass
import io
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import pytest

from gpuslate.bench.experiment import ExperimentProgress
from gpuslate.bench.metrics import RequestRecord, level_result
from gpuslate.bench.plan import LoadPlan
from gpuslate.bench.result import BenchResult
from gpuslate.cli.commands.experiment import ProgressDisplay
from gpuslate.cli.main import main
from gpuslate.cli.render.bench import print_bench
from gpuslate.gpu.simhost.host import SimHost
from helpers import SRC, experiment_folder, kill_leftovers, run_cli

SGR = re.compile(r"\x1b\[[0-9;]*m")
LONG = " --model-path /models/meta-llama/Meta-Llama-3.1-405B-Instruct-FP8 --tensor-parallel-size 8 --port 30000"
WIDTHS = (60, 80, 120)
USER = getpass.getuser()


class Terminal(io.StringIO):
    """A terminal that cannot say its size: $COLUMNS columns (80 without it, gpuslate's and rich's
    default)."""

    def isatty(self) -> bool:
        return True

    def fileno(self) -> int:
        raise io.UnsupportedOperation("fileno")


@pytest.fixture
def term(monkeypatch: pytest.MonkeyPatch, sim_host: SimHost, tmp_path: Path):
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("GPUSLATE_LOCK_DIR", str(tmp_path / "locks"))
    inherited = os.environ.get("PYTHONPATH")  # the units `up` starts here run this source
    monkeypatch.setenv("PYTHONPATH", SRC + (os.pathsep + inherited if inherited else ""))
    monkeypatch.delenv("NO_COLOR", raising=False)
    screens: list[Terminal] = []

    def run(*argv: str, width: int = 80) -> tuple[int, list[str]]:
        monkeypatch.setenv("COLUMNS", str(width))
        screen = Terminal()
        screens.append(screen)
        monkeypatch.setattr(sys, "stdout", screen)
        try:
            code = main(list(argv))
        finally:
            monkeypatch.setattr(sys, "stdout", sys.__stdout__)
        return code, SGR.sub("", screen.getvalue()).splitlines()

    yield run
    from gpuslate.units.store import UnitStore
    from gpuslate.units.unit import load_units

    state = Path(os.environ["GPUSLATE_STATE_DIR"])
    kill_leftovers(sim_host, load_units(UnitStore(state)) if state.is_dir() else [])


def fits(lines: list[str], *whole: str, width: int = 80, prose: tuple[str, ...] = ()) -> str:
    """No line wider than ``width`` but a word that cannot be broken (a path) and the sentences
    that start with ``prose`` (the terminal wraps them; a table row it would wrap is unreadable);
    each of ``whole`` shown whole."""
    over = [ln for ln in lines if len(ln) > width and len(ln.split()) > 1 and not ln.startswith(prose)]
    assert not over, "\n".join(over)
    text = "\n".join(lines)
    for w in whole:
        assert w in text, f"{w!r} not shown whole in:\n{text}"
    return text


def row_of(lines: list[str], pid: int) -> str:
    """The table row of process ``pid`` (its PID a whole cell: right-aligned, or after a tree branch)."""
    found = [ln for ln in lines if re.search(rf"(^|\s|└ ){pid}\s", ln)]
    assert len(found) == 1, (pid, lines)
    return found[0]


@pytest.mark.parametrize("width", WIDTHS)
def test_status(term, hold, width: int) -> None:
    h = hold("--gpus", "0-7", "--memory", "3GiB", "--workers", "8", "--orphan-workers",
             "--title", "sglang::scheduler_TP{rank}" + LONG)
    code, lines = term("status", width=width)
    assert code == 0
    text = fits(lines, "Memory used/total", "GPU memory", width=width)
    assert text.count("3.0 GiB") >= 16  # each GPU's used memory and each worker's
    for pid in h.workers:  # each worker's row: its GPU (its title's rank), PID, memory and user whole
        row = row_of(lines, pid)
        extras = r" +\d+% +\d+\.\d MiB +\d+\.\ds" if width >= 120 else ""  # CPU, host memory, elapsed: room for them
        assert re.match(rf"\s*(\d) └ {pid} +compute +3\.0 GiB {USER}{extras} sglang::scheduler_TP\1", row), row
    # the launcher's row names the job: its command gets the width the line has left
    launcher = row_of(lines, h.pid)
    assert re.match(rf"\s*{h.pid} launcher +{USER} …/python -m gpuslate ", launcher), launcher
    assert len(launcher) >= width - 12, launcher  # no more free than a word that did not fit


@pytest.mark.parametrize("width", WIDTHS)
def test_status_compact(term, hold, width: int) -> None:
    """One line per GPU: its memory as a bar and in figures, and who holds it: the largest holder's
    PID, user and memory whole, the others as many as fit, then how many more (+N)."""
    big = hold("--gpus", "1", "--memory", "60GiB")
    small = hold("--gpus", "0-1", "--memory", "30GiB", "--workers", "2", "--title", "sglang::scheduler_TP{rank}" + LONG)
    code, lines = term("status", "--compact", width=width)
    assert code == 0
    fits(lines, width=width)
    rows = {int(ln.split()[0]): ln for ln in lines[1:] if ln.split() and ln.split()[0].isdigit()}
    assert sorted(rows) == list(range(8))
    assert "▕" in rows[0] and "█" in rows[0] and "30.0/96.0 GiB" in rows[0] and f" {USER} 30.0 GiB" in rows[0]
    assert "90.0/96.0 GiB" in rows[1] and f"{big.pid} {USER} 60.0 GiB" in rows[1]  # the largest first
    assert any(f", {w} {USER} 30.0 GiB" in rows[1] for w in small.workers) or rows[1].endswith(" +1"), rows[1]
    assert "0 B/96.0 GiB" in rows[7] and rows[7].rstrip().endswith("°C")  # free: no holder


@pytest.mark.parametrize("width", WIDTHS)
def test_clear_plan_result_and_audit(term, hold, width: int) -> None:
    h = hold("--gpus", "0-3", "--memory", "2GiB", "--workers", "4", "--title", "python3 -m sglang.launch_server" + LONG)
    code, lines = term("clear", "--dry-run", width=width)
    assert code == 0
    fits(lines, "launcher", "holder", "2.0 GiB", "0-7", width=width)
    assert re.match(rf"\s*{h.pid} launcher +{USER} - +- python3", row_of(lines, h.pid))
    rows = [row_of(lines, p) for p in h.workers]
    gpus = [int(re.match(rf"\s*{p} holder +{USER} (\d) +2\.0 GiB python3", r)[1]) for p, r in zip(h.workers, rows)]
    assert sorted(gpus) == [0, 1, 2, 3]
    # the launcher first, then its workers by GPU
    order = [lines.index(row_of(lines, h.pid))] + [lines.index(r) for _, r in sorted(zip(gpus, rows))]
    assert order == sorted(order), lines
    code, lines = term("clear", "--yes", "--grace", "5", width=width)
    assert code == 0
    fits(lines, "Signals", "Ended", "Clean", width=width, prose=("Timings: ",))
    for pid, gpu in zip(h.workers, gpus):
        row = row_of(lines, pid)
        # signals condensed; when it ended; then the command in what is left
        assert re.match(rf"\s*{pid} holder +{USER} {gpu} +2\.0 GiB TERM +\d+\.\d\ds python3", row), row
    if width >= 80:  # the audit log's table is shown whole from 80 columns
        code, lines = term("audit", width=width)
        assert code == 0
        fits(lines, *(str(p) for p in h.workers), "delivered", width=width)
def test_wait_diagnosis(term, hold) -> None:
    h = hold("--gpus", "1", "--memory", "5GiB",
             "--title", "/tmp/x/.venv/bin/python3 /tmp/x/.venv/bin/vllm serve" + LONG)
    code, lines = term("wait", "--free", "--gpus", "1", "--timeout", "0.1")
    assert code == 4
    fits(lines, f"PID {h.pid} ({getpass.getuser()}, …/python3 /tmp/x/.venv/bin/vllm serve …)", "5.0 GiB")
    r = run_cli("wait", "--free", "--gpus", "1", "--timeout", "0.1")  # piped: never cut
    assert f"PID {h.pid} ({getpass.getuser()}, /tmp/x/.venv/bin/python3 /tmp/x/.venv/bin/vllm serve{LONG})" in r.stdout


@pytest.mark.parametrize("width", WIDTHS)
def test_units_up_ps_logs_swap_down(term, tmp_path, monkeypatch, width: int) -> None:
    hold_cmd = [sys.executable, "-m", "gpuslate", "sim", "hold", "--memory", "1GiB", "--workers", "2",
                "--title", "sglang::scheduler_TP{rank}" + LONG]
    old, new = "baseline-llama-405b-fp8", "speculative-llama-405b-fp8"
    unit = f'command = {json.dumps(hold_cmd)}\ngpus = "0-1"\nready_log = \'"ready": true\'\n'
    (tmp_path / "gpuslate.toml").write_text(f"[units.{old}]\n{unit}\n[units.{new}]\n{unit}")
    monkeypatch.chdir(tmp_path)
    code, lines = term("up", old, width=width)
    assert code == 0, lines
    fits(lines, old, "0-1", width=width, prose=("  log: ",))  # a path: never broken
    code, lines = term("ps", width=width)
    assert code == 0
    text = fits(lines, "ready", "0-1", "2.0 GiB", width=width)
    assert sum(ln.split()[:1] == [old] for ln in lines) >= 1 and "Name" in text  # every table names its unit
    code, lines = term("logs", old, width=width)
    assert code == 0 and any('"ready": true' in ln for ln in lines)
    code, lines = term("swap", old, new, width=width)
    assert code == 0, lines
    fits(lines, "downtime", "released", width=width, prose=("  log: ",))
    code, lines = term("down", new, width=width)
    assert code == 0
    fits(lines, "released", width=width)


@pytest.mark.parametrize("width", WIDTHS)
def test_sim_init(term, width: int) -> None:
    folder = tempfile.mkdtemp(prefix="g")  # a short path: a long one is a word no terminal breaks
    try:
        code, lines = term("sim", "init", folder + "/host", width=width)
        assert code == 0
        fits(lines, f"export GPUSLATE_SIM={folder}/host", "8 ×", "release delay", width=width)
    finally:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("width", WIDTHS)
def test_the_experiment_and_demo_live_line(width: int) -> None:
    """The live line of ``experiment run`` and the demo: it fits (a line the terminal wraps is drawn
    again under itself at each refresh), the deployment and its level whole."""
    display = ProgressDisplay(10)
    display.current = ExperimentProgress("speculative-llama-405b", 1, 2, "running", 16, 1, 37, 64, 10, 24, 71.0,
                                         40.0, time.monotonic() + 40)
    line = display.line(width)
    assert len(line) < width and re.match(r"speculative-llama-405b( \(2/2\))? c=16 r", line) and "10/24" in line, line
    display.current = display.current._replace(total=None) if hasattr(display.current, "_replace") else \
        ExperimentProgress("speculative-llama-405b", 1, 2, "running", 16, 1, 37, None, 10, 24, 71.0, 40.0, None)
    assert "?" not in display.line(width) and "?" not in display.line(None)  # a level bounded by time


def _level(c: int, *, interrupted: bool = False):
    recs = [RequestRecord(ok=True, start=0.01 * i, ttft=0.05, latency=1.5 + 0.01 * i,
                          chunk_times=[0.05 + 0.01 * k for k in range(128)], chunk_tokens=[1] * 128,
                          output_tokens=128, prompt_tokens=512) for i in range(8 * c)]
    recs.append(RequestRecord(ok=False, start=0.0, latency=0.1, error="HTTP 503: overloaded"))
    return level_result(recs, concurrency=c, request_rate=None, interrupted=interrupted, accept_length=2.91,
                        spec_step_share=1.0)


@pytest.mark.parametrize("interrupted", [False, True])
def test_bench(monkeypatch, interrupted: bool) -> None:
    levels = [_level(c) for c in (1, 2, 4, 8, 16, 32, 64, 128)]
    if interrupted:
        levels[-1] = _level(128, interrupted=True)
    result = BenchResult("http://127.0.0.1:30000", "meta-llama/Meta-Llama-3.1-405B-Instruct-FP8", "completions",
                         "2026-01-01T00:00:00Z", LoadPlan(concurrency=(1, 2, 4, 8, 16, 32, 64, 128)),
                         {"engine": "sglang", "version": "0.4.6"}, levels, interrupted=interrupted)
    for screen, width in ((Terminal(), 80), (io.StringIO(), None)):
        monkeypatch.setattr(sys, "stdout", screen)
        print_bench(result)
        monkeypatch.setattr(sys, "stdout", sys.__stdout__)
        lines = SGR.sub("", screen.getvalue()).splitlines()
        fits(lines, "Conc", "Out tok/s", "Peak tok/s", "TTFT ms", "Chunk gap ms", "E2E ms", "Spec steps",
             width=width or 1000)
        rows = [ln.split() for ln in lines if ln.split() and re.fullmatch(r"\d+\*?", ln.split()[0])]
        # every row of every table names its level (the last one marked when an interrupt cut it short)
        labels = [str(c) for c in (1, 2, 4, 8, 16, 32, 64)] + ["128*" if interrupted else "128"]
        assert [r[0] for r in rows] == labels * (1 if width is None else 2), lines
        assert "…" not in "\n".join(lines)
        assert ("interrupted: levels marked * were cut short" in " ".join(lines[:2])) == interrupted


#: vLLM's summary of one run (vllm/benchmarks/serve.py, benchmark()): its lines, in its order
VLLM_BLOCK = ["Successful requests:", "Failed requests:", "Maximum request concurrency:", "Benchmark duration (s):",
              "Total input tokens:", "Total generated tokens:", "Request throughput (req/s):",
              "Output token throughput (tok/s):", "Peak output token throughput (tok/s):",
              "Total token throughput (tok/s):", "---------------Time to First Token----------------",
              "Mean TTFT (ms):", "Median TTFT (ms):", "P99 TTFT (ms):",
              "-----Time per Output Token (excl. 1st token)------", "Mean TPOT (ms):", "Median TPOT (ms):",
              "P99 TPOT (ms):", "---------------Inter-token Latency----------------", "Mean ITL (ms):",
              "Median ITL (ms):", "P99 ITL (ms):", "----------------End-to-end Latency----------------",
              "Mean E2EL (ms):", "Median E2EL (ms):", "P99 E2EL (ms):"]


def test_bench_summary_block_is_vllms(monkeypatch) -> None:
    """Each level first as ``vllm bench serve`` prints its run: the same labels in the same order, 50
    columns wide (so it reads whole at 60), the means beside the median and p99."""
    levels = [_level(1), _level(4)]
    result = BenchResult("http://127.0.0.1:30000", "m", "completions", "2026-01-01T00:00:00Z",
                         LoadPlan(concurrency=(1, 4)), {"engine": "sglang"}, levels)
    screen = io.StringIO()
    monkeypatch.setattr(sys, "stdout", screen)
    print_bench(result)
    monkeypatch.setattr(sys, "stdout", sys.__stdout__)
    lines = screen.getvalue().splitlines()
    starts = [i for i, ln in enumerate(lines) if "Serving Benchmark Result" in ln]
    assert [lines[i] for i in starts] == ["==== Serving Benchmark Result (concurrency 1) ====",
                                          "==== Serving Benchmark Result (concurrency 4) ===="]
    for at, lv in zip(starts, levels):
        block = lines[at + 1:lines.index("=" * 50, at)]
        labels = [ln if ln.startswith("--") else ln[:41].rstrip() for ln in block]
        assert [x for x in labels if x in VLLM_BLOCK] == VLLM_BLOCK, block
        assert max(map(len, block)) <= 60
        figures = {ln[:41].rstrip(): ln[41:] for ln in block}
        assert figures["Total generated tokens:"] == str(lv.output_tokens)
        assert figures["Mean E2EL (ms):"] == f"{lv.e2e_ms.mean:.2f}" != figures["P99 E2EL (ms):"]
        assert figures["Median TPOT (ms):"] == f"{lv.tpot_ms.p50:.2f}"
        assert figures["Request throughput (req/s):"] == f"{lv.request_throughput:.2f}"


def test_experiment_report(term, tmp_path) -> None:
    out = experiment_folder(tmp_path)
    code, lines = term("experiment", "report", str(out))
    assert code == 0
    text = fits(lines, "output tok/s", "TTFT p50 ms", "e2e p50 ms", "ok/failed", "Recommendation",
                prose=("  SGLang: ", "  vLLM: "))
    # every table names its deployment in each row
    assert text.count("  base ") >= 2 * 2 and text.count("  spec ") >= 2 * 2


def test_fleet_summary(monkeypatch) -> None:
    from gpuslate.cli.fleet import print_fleet
    from gpuslate.errors import HostUnreachable
    from gpuslate.remote.fleet import FleetResult, HostOutcome
    from gpuslate.remote.hosts import parse_host

    hosts = [HostOutcome(parse_host(f"root@gpu-node-{i:03d}.cluster.example.com"), None,
                         HostUnreachable(f"gpu-node-{i:03d}.cluster.example.com: ssh: connect to host port 22: "
                                         "No route to host (is it up, and is this its name?)"), 10.0)
             for i in range(3)]
    screen = Terminal()
    monkeypatch.setattr(sys, "stdout", screen)
    print_fleet(FleetResult(["status"], hosts), "status")
    monkeypatch.setattr(sys, "stdout", sys.__stdout__)
    fits(SGR.sub("", screen.getvalue()).splitlines(), "gpu-node-000.cluster.example.com", "unreachable",
         prose=("error (unreachable): ",))
