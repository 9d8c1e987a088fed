"""The documents of the commands beyond the host verbs read back into their result types too:
``sim init``, ``sim leak``, ``install`` (--out here, installed on a host), ``experiment report``
(and ``run``'s, which adds ``run``), ``bench``. ``X.from_json(doc).to_json() == doc`` on documents of
real runs, and another schema or a malformed document is one BadDocument. (bench's and the Slurm
hooks' real runs are read back in tests/remote/test_local_equals_remote_more.py and
tests/slurm/test_hook_documents.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuslate.bench.metrics import level_result
from gpuslate.bench.plan import LoadPlan
from gpuslate.bench.report import DemoResult, ExperimentStatus, Report
from gpuslate.bench.result import BenchResult
from gpuslate.cli.exits import exit_status_for_result
from gpuslate.errors import BadDocument
from gpuslate.gpu.simhost.results import SimInitResult, SimLeakResult, SimStatus
from gpuslate.remote.zipapp import InstallResult, InstallStatus
from gpuslate.slurm.hooks import HookResult
from helpers import experiment_folder, gpuslate_env


def _json(*args: str, cwd: Path | None = None) -> tuple[int, dict[str, Any]]:
    r = subprocess.run([sys.executable, "-m", "gpuslate", *args, "--json"], capture_output=True, text=True,
                       env=gpuslate_env(), timeout=60, cwd=cwd)
    assert r.stdout, r.stderr
    return r.returncode, json.loads(r.stdout)


def test_sim_documents_read_back(tmp_path):
    rc, doc = _json("sim", "init", str(tmp_path / "s"), "--count", "3", "--memory-api", "v1")
    assert rc == 0 and doc["gpus"] == 3
    back = SimInitResult.from_json(doc)
    assert back.to_json() == doc and back.status is SimStatus.CREATED
    rc, doc = _json("sim", "leak", "--sim", str(tmp_path / "s"), "--gpu", "2", "--memory", "1GiB")
    assert rc == 0 and doc["gpu"] == 2
    back_leak = SimLeakResult.from_json(doc)
    assert back_leak.to_json() == doc and exit_status_for_result(back_leak.status) == 0


def test_install_documents_read_back(tmp_path):
    rc, doc = _json("install", "--out", str(tmp_path / "g.pyz"))
    assert rc == 0 and doc["status"] == "written"
    assert InstallResult.from_json(doc).to_json() == doc
    on_host = InstallResult(InstallStatus.INSTALLED, "0.1.0", "ab" * 32, 123, "/h/.local/share/gpuslate/gpuslate.pyz",
                            "/h/.local/bin/gpuslate", "/usr/bin/python3", "3.12.3", "ok", None, ("rich",), ["w"])
    assert InstallResult.from_json(on_host.to_json()) == on_host


def test_experiment_documents_read_back(tmp_path):
    out = experiment_folder(tmp_path, failed=1)
    rc, doc = _json("experiment", "report", str(out))
    assert rc == 0 and doc["recommendation"]["threshold"] == 1
    back = Report.from_json(doc)
    assert back.to_json() == doc and back.status is ExperimentStatus.REPORTED
    assert back.files[:3] == ["report.md", "summary.json", "summary.csv"]
    ran = {**doc, "run": {"points_run": 8, "points_skipped": 0, "elapsed_s": 1.5, "transitions": []}}
    back = Report.from_json(ran)
    assert back.to_json() == ran and back.status is ExperimentStatus.PARTIAL  # a request failed at each point
    assert exit_status_for_result(back.status) == 7


_SCHEMAS = {SimInitResult: "sim.init", SimLeakResult: "sim.leak", InstallResult: "install", BenchResult: "bench",
            Report: "experiment", HookResult: "slurm", DemoResult: "demo"}


@pytest.mark.parametrize("cls", list(_SCHEMAS))
def test_another_schema_or_a_malformed_document_is_one_error(cls):
    for bad in ([], "x", {"schema": "gpuslate.other.v1"}, {"schema": None}):
        with pytest.raises(BadDocument, match="not a gpuslate"):
            cls.from_json(bad)
    schema = _SCHEMAS[cls]
    with pytest.raises(BadDocument, match="not a gpuslate"):
        cls.from_json({"schema": f"gpuslate.{schema}.v2"})  # a newer version: not guessed at
    with pytest.raises(BadDocument, match=f"malformed gpuslate.{schema}.v1 document"):
        cls.from_json({"schema": f"gpuslate.{schema}.v1"})


def test_a_document_without_what_its_renderer_shows_is_one_error(tmp_path):
    """Read back, a document has every field its renderer shows, of its type: else BadDocument (the
    host's failure over --host), never a renderer's traceback halfway through a host's output."""
    bench = BenchResult("http://h:1", "m", "completions", "2026-12-01T00:00:00Z", LoadPlan(),
                        levels=[level_result([], concurrency=1, request_rate=None)],
                        in_flight=[{"level": 0, "elapsed_s": 1.5, "chunks_received": 3}]).to_json()
    assert BenchResult.from_json(bench).to_json() == bench
    report = Report.from_json(_json("experiment", "report", str(experiment_folder(tmp_path)))[1]).to_json()
    cases: list[tuple[type, dict[str, Any], Callable[[dict[str, Any]], object]]] = [
        (BenchResult, bench, lambda d: d["levels"][0].update(request_throughput="fast")),
        (BenchResult, bench, lambda d: d["levels"][0].update(duration_s=None)),
        (BenchResult, bench, lambda d: d["in_flight"][0].pop("chunks_received")),
        (BenchResult, bench, lambda d: d["plan"].update(goodput={"latency": 5})),
        (Report, report, lambda d: d["levels"][0].pop("ttft_ms")),
        (Report, report, lambda d: d["points"].update(done="all")),
        (Report, report, lambda d: d["recommendation"]["apply"].pop("status")),
        (Report, report, lambda d: d["recommendation"]["apply"].update(blockers=[{"setting": 1}])),
        (Report, report, lambda d: d.update(verification={"levels": [{"concurrency": 1}]})),
        (Report, report, lambda d: d.update(time_scale="x"))]
    for cls, doc, spoil in cases:
        bad = json.loads(json.dumps(doc))
        spoil(bad)
        with pytest.raises(BadDocument, match="malformed"):
            cls.from_json(bad)
