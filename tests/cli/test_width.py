"""Every table the CLI prints, on a terminal of 80 columns: no line wider than the terminal and no
key column cut (every row still says its PID, GPUs, memory, level or unit); piped, nothing cut.

The commands run in this process, as ``gpuslate`` runs them (``cli.main.main``), against a
simulated host and real processes, with stdout a terminal of 80 columns (an ``isatty`` stream
whose size cannot be asked: gpuslate's plain tables and rich both take 80 then, as for a terminal
that gives no size). bench's and an experiment's tables are rendered from their results."""

from __future__ import annotations

import getpass
import io
import json
import os
import re
import sys
from pathlib import Path

import pytest

from gpuslate.bench.metrics import RequestRecord, level_result
from gpuslate.bench.plan import LoadPlan
from gpuslate.bench.result import BenchResult
from gpuslate.cli.main import main
from gpuslate.cli.render.bench import print_bench
from gpuslate.gpu.simhost.host import SimHost
from helpers import SRC, experiment_folder, kill_leftovers, run_cli

SGR = re.compile(r"\x1b\[[0-9;]*m")
LONG = " --model-path /models/meta-llama/Meta-Llama-3.1-405B-Instruct-FP8 --tensor-parallel-size 8 --port 30000"


class Terminal(io.StringIO):
    """A terminal that cannot say its size: 80 columns (gpuslate's and rich's default)."""

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

    def run(*argv: str) -> tuple[int, list[str]]:
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


def test_status(term, hold) -> None:
    h = hold("--gpus", "0-7", "--memory", "3GiB", "--workers", "8", "--orphan-workers",
             "--title", "sglang::scheduler_TP{rank}" + LONG)
    code, lines = term("status")
    assert code == 0
    text = fits(lines, "Memory used/total", "GPU memory", *(str(p) for p in h.workers))
    assert text.count("3.0 GiB") >= 16  # each GPU's used memory and each worker's


def test_clear_plan_result_and_audit(term, hold) -> None:
    h = hold("--gpus", "0-3", "--memory", "2GiB", "--workers", "4", "--title", "python3 -m sglang.launch_server" + LONG)
    code, lines = term("clear", "--dry-run")
    assert code == 0
    text = fits(lines, *(str(p) for p in h.pids), "launcher", "holder", "2.0 GiB", "0-7")
    assert "python3 -m sglang.launch_server …" in text  # the program named, the command cut in the middle
    code, lines = term("clear", "--yes", "--grace", "5")
    assert code == 0
    fits(lines, *(str(p) for p in h.workers), "SIGTERM", "Clean")
    code, lines = term("audit")
    assert code == 0
    fits(lines, *(str(p) for p in h.workers), "delivered")


def test_wait_diagnosis(term, hold) -> None:
    h = hold("--gpus", "1", "--memory", "5GiB",
             "--title", "/tmp/x/.venv/bin/python3 /tmp/x/.venv/bin/vllm serve" + LONG)
    code, lines = term("wait", "--free", "--gpus", "1", "--timeout", "0.1")
    assert code == 4
    fits(lines, f"PID {h.pid} ({getpass.getuser()}, …/python3 /tmp/x/.venv/bin/vllm serve …)", "5.0 GiB")
    r = run_cli("wait", "--free", "--gpus", "1", "--timeout", "0.1")  # piped: never cut
    assert f"PID {h.pid} ({getpass.getuser()}, /tmp/x/.venv/bin/python3 /tmp/x/.venv/bin/vllm serve{LONG})" in r.stdout


def test_units_up_ps_logs_swap_down(term, tmp_path, monkeypatch) -> None:
    hold_cmd = [sys.executable, "-m", "gpuslate", "sim", "hold", "--memory", "1GiB", "--workers", "2",
                "--title", "sglang::scheduler_TP{rank}" + LONG]
    old, new = "baseline-llama-405b-fp8", "speculative-llama-405b-fp8"
    unit = f'command = {json.dumps(hold_cmd)}\ngpus = "0-1"\nready_log = \'"ready": true\'\n'
    (tmp_path / "gpuslate.toml").write_text(f"[units.{old}]\n{unit}\n[units.{new}]\n{unit}")
    monkeypatch.chdir(tmp_path)
    code, lines = term("up", old)
    assert code == 0, lines
    fits(lines, old, "0-1", prose=("Unit ", "  readiness: ", "  log: "))
    code, lines = term("ps")
    assert code == 0
    fits(lines, old, "ready", "0-1", "2.0 GiB")
    code, lines = term("logs", old)
    assert code == 0 and any('"ready": true' in ln for ln in lines)
    code, lines = term("swap", old, new)
    assert code == 0, lines
    fits(lines, "downtime", "released", prose=("Unit ", "  readiness: ", "  log: "))
    code, lines = term("down", new)
    assert code == 0
    fits(lines, "released", prose=("Unit ",))


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


def test_experiment_report(term, tmp_path) -> None:
    out = experiment_folder(tmp_path)
    code, lines = term("experiment", "report", str(out))
    assert code == 0
    text = fits(lines, "output tok/s", "TTFT p50", "ok/failed", "Recommendation", prose=("  SGLang: ", "  vLLM: "))
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
