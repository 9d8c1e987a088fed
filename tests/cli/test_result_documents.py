"""Every result document reads back into its result type: ``X.from_json(doc).to_json() == doc`` on
documents of real runs against a simulated host (status, clear, wait, up, down, swap, ps), and a
document of another schema or a malformed one is one BadDocument, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslate.clearing.clear import ClearResult
from gpuslate.clearing.wait import WaitResult
from gpuslate.errors import BadDocument
from gpuslate.host.snapshot import Snapshot
from gpuslate.units.batch import BatchResult
from gpuslate.units.lifecycle import DownResult, UpResult
from gpuslate.units.listing import PsResult
from gpuslate.units.logfile import LogsResult
from gpuslate.units.remove import RmResult
from gpuslate.units.restart import RestartResult
from gpuslate.units.swap import SwapResult
from helpers import gpuslate_env

SERVE = [sys.executable, "-m", "gpuslate", "sim", "serve", "--startup-seconds", "0.1", "--memory", "2GiB"]


@pytest.fixture
def run(sim_host, tmp_path: Path) -> Callable[..., tuple[int, dict[str, Any]]]:
    """``gpuslate ARGS --json`` on the simulated host: (exit code, document)."""
    env = gpuslate_env({"GPUSLATE_LOCK_DIR": str(tmp_path / "locks")})

    def go(*args: str) -> tuple[int, dict[str, Any]]:
        r = subprocess.run([sys.executable, "-m", "gpuslate", "--json", *args], capture_output=True, text=True,
                           env=env, timeout=60, cwd=str(tmp_path))
        assert r.stdout, r.stderr
        return r.returncode, json.loads(r.stdout)

    yield go
    for name in ("a", "b", "c"):
        go("down", name)


def _port() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


#: values of another type, or out of range, that a peer could put in any field
_WRONG_VALUES: tuple[object, ...] = ("12", -5, 1.5, True, None, [], {}, 10**18)


def _leaves(doc: object, path: tuple = ()) -> list[tuple]:
    if isinstance(doc, dict):
        return [leaf for k, v in doc.items() if k != "schema" for leaf in _leaves(v, (*path, k))]
    if isinstance(doc, list):
        return [leaf for i, v in enumerate(doc[:3]) for leaf in _leaves(v, (*path, i))]
    return [path]


def every_corruption_is_one_error(cls: Any, doc: dict[str, Any]) -> int:
    """Issue 32: each field of a real document made a value of another type or out of range, one at a
    time: the document reads (the value was one the field may hold) or is one BadDocument; never
    another exception. The number of documents that read."""
    import copy

    read = 0
    for path in _leaves(doc):
        for value in _WRONG_VALUES:
            bad = copy.deepcopy(doc)
            node: Any = bad
            for key in path[:-1]:
                node = node[key]
            if node[path[-1]] == value and type(node[path[-1]]) is type(value):
                continue
            node[path[-1]] = value
            try:
                back = cls.from_json(bad)
            except BadDocument:
                continue
            read += 1
            if path[-1] in _SIZES:  # what a screen shows as bytes is never negative, nor a fraction or a string
                assert _sizes_ok(back.to_json()), (path, value)
    return read


_SIZES = {"used", "used_memory", "bytes", "total", "free", "reserved", "max_used", "gpu_memory", "read_bytes"}


def _sizes_ok(doc: object) -> bool:
    if isinstance(doc, dict):
        return all((v is None or (type(v) is int and v >= 0)) if k in _SIZES and not isinstance(v, (dict, list))
                   else _sizes_ok(v) for k, v in doc.items())
    if isinstance(doc, list):
        return all(_sizes_ok(v) for v in doc)
    return True


def test_status_and_clear_documents_read_back(run, hold):
    hold("--memory", "0", "--gpus", "2", "--title", "my-monitor")  # spared: a handle holder
    h = hold("--memory", "6GiB", "--gpus", "0-1", "--workers", "2", "--orphan-workers")
    rc, doc = run("status")
    assert rc == 0 and any(p["kind"] == "handle" for g in doc["gpus"] for p in g["processes"])
    assert Snapshot.from_json(doc).to_json() == doc
    rc, doc = run("wait", "--free", "--gpus", "0", "--timeout", "0")
    assert rc == 4 and not doc["ok"] and doc["diagnosis"]
    assert WaitResult.from_json(doc).to_json() == doc
    for args in (("--dry-run",), ("--pid", str(h.pid), "--grace", "2", "--yes"), ("--yes", "--grace", "2")):
        rc, doc = run("clear", *args)
        assert rc == 0, doc
        assert doc["targets"] or args[0] == "--yes"  # the --pid clear ended them
        back = ClearResult.from_json(doc)
        assert back.to_json() == doc and back.status.value == doc["status"]
        doc_clear = doc
    rc, doc = run("wait", "--free", "--timeout", "5")
    assert rc == 0 and WaitResult.from_json(doc).to_json() == doc
    for cls, args in ((Snapshot, ("status",)), (WaitResult, ("wait", "--free", "--timeout", "0"))):
        every_corruption_is_one_error(cls, run(*args)[1])
    every_corruption_is_one_error(ClearResult, doc_clear)


def test_unit_documents_read_back(run):
    pa, pb = _port(), _port()
    rc, doc = run("up", "a", "--gpus", "0,1", "--port", pa, "--engine", "sglang", "--smoke", "--", *SERVE, "--port", pa)
    assert rc == 0, doc
    assert UpResult.from_json(doc).to_json() == doc
    rc, doc = run("ps")
    assert rc == 0 and [u["state"] for u in doc["units"]] == ["ready"]
    assert PsResult.from_json(doc).to_json() == doc
    rc, doc = run("up", "c", "--gpus", "3", "--start-timeout", "5", "--ready-log", "never", "--",
                  sys.executable, "-c", "raise SystemExit(3)")
    assert rc == 6 and doc["status"] == "exited", doc
    assert doc["status"] == "exited" and doc["teardown"] is not None
    assert UpResult.from_json(doc).to_json() == doc
    rc, doc = run("up", "b", "--gpus", "2", "--port", pb, "--", *SERVE, "--port", pb)
    assert rc == 0, doc
    rc, doc = run("down", "b")
    assert rc == 0 and doc["processes"], doc
    assert DownResult.from_json(doc).to_json() == doc
    rc, doc = run("swap", "a", "b")
    assert rc == 0 and doc["status"] == "swapped", doc
    back = SwapResult.from_json(doc)
    assert back.to_json() == doc and back.overhead_s == doc["overhead_s"]
    swap = doc
    rc, doc = run("ps")
    assert sorted(u["state"] for u in doc["units"]) == ["failed", "ready", "stopped"]
    assert PsResult.from_json(doc).to_json() == doc
    every_corruption_is_one_error(PsResult, doc)
    every_corruption_is_one_error(SwapResult, swap)


@pytest.mark.parametrize("cls", [Snapshot, ClearResult, WaitResult, UpResult, DownResult, SwapResult, PsResult,
                                 RestartResult, RmResult, BatchResult, LogsResult])
def test_another_schema_or_a_malformed_document_is_one_error(cls):
    for bad in ([], "x", {"schema": "gpuslate.other.v1"}, {"schema": None}):
        with pytest.raises(BadDocument, match="not a gpuslate"):
            cls.from_json(bad)
    schema = {Snapshot: "status", ClearResult: "clear", WaitResult: "wait", UpResult: "up", DownResult: "down",
              SwapResult: "swap", PsResult: "ps", RestartResult: "restart", RmResult: "rm", BatchResult: "batch",
              LogsResult: "logs"}[cls]
    with pytest.raises(BadDocument, match="not a gpuslate"):
        cls.from_json({"schema": f"gpuslate.{schema}.v2"})  # a newer version: not guessed at
    with pytest.raises(BadDocument, match=f"malformed gpuslate.{schema}.v1 document"):
        cls.from_json({"schema": f"gpuslate.{schema}.v1"})


def test_a_batch_holding_another_document_or_a_bad_time_is_one_error():
    with pytest.raises(BadDocument, match="expected an up, down or restart document"):
        BatchResult.from_json({"schema": "gpuslate.batch.v1", "ok": True, "status": "done", "verb": "up",
                               "results": [{"schema": "gpuslate.status.v1"}], "skipped": [], "not_run": [],
                               "total_s": 1})
    logs = {"schema": "gpuslate.logs.v1", "name": "a", "log": "/l", "exists": True, "running": False, "tail": None,
            "lines": ["x"]}
    assert LogsResult.from_json(logs).since is None  # a document from before --since reads as it was
    for bad in ({"times": ["yesterday"]}, {"times": [None, None]}, {"since": "soon"}):
        with pytest.raises(BadDocument, match=r"malformed gpuslate\.logs\.v1"):
            LogsResult.from_json({**logs, **bad})


_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
_opt_int = st.none() | st.integers(0, 2**40)
_holder = st.fixed_dictionaries({
    "pid": st.integers(1, 2**22), "start_ticks": st.none(),  # "started" follows from the ticks
    "kind": st.sampled_from(["compute", "graphics", "mps", "handle"]),
    "used_memory": _opt_int, "user": st.none() | _text, "uid": st.none() | st.integers(0, 2**32 - 1),
    "name": st.none() | _text, "command": st.none() | _text, "started": st.none(),
    "ppid": st.none() | st.integers(0, 2**22), "pgid": st.none() | st.integers(0, 2**22),
    "sid": st.none() | st.integers(0, 2**22),
    "root_pid": st.integers(1, 2**22), "state": st.none() | st.sampled_from(["S", "R", "Z"]),
    "container": st.none() | _text, "cgroup": st.none() | _text, "visible": st.booleans(),
    "daemon": st.none() | st.just("nvidia-cuda-mps-server"), "mps_server": st.none() | st.integers(1, 2**22),
    "daemon_unproven": st.none() | _text,
    "cpu_time_s": st.none() | st.integers(0, 10**8).map(lambda n: n / 100), "host_memory": _opt_int})
_gpu = st.fixed_dictionaries({
    "index": st.integers(0, 7), "uuid": st.none() | _text, "name": st.none() | _text,
    "memory": st.none() | st.fixed_dictionaries({"total": st.integers(0, 2**40), "used": st.integers(0, 2**40),
                                                 "reserved": st.integers(0, 2**30), "free": st.integers(0, 2**40)}),
    "utilization_pct": st.none() | st.integers(0, 100), "temperature_c": st.none() | st.integers(0, 99),
    "power_w": st.none() | st.floats(0, 1000), "power_limit_w": st.none() | st.floats(0, 1000),
    "pstate": st.none() | st.just("P0"), "error": st.none() | _text, "processes": st.lists(_holder, max_size=3)})


@settings(max_examples=60, deadline=None)
@given(st.fixed_dictionaries({
    "schema": st.just("gpuslate.status.v1"), "host": _text, "backend": _text, "driver_version": st.none() | _text,
    "taken_at": st.just("2026-12-01T10:11:12.345Z"), "gpus": st.lists(_gpu, max_size=3),
    "host_processes": st.lists(_holder, max_size=2), "warnings": st.lists(_text, max_size=2)}))
def test_any_status_document_reads_back(doc):
    assert Snapshot.from_json(doc).to_json() == doc


#: (where, a value of the wrong type or out of range) for fields of a status document
_WRONG = [("gpus.0.memory.used", "12"), ("gpus.0.memory.used", -5), ("gpus.0.memory.used", 1.5),
          ("gpus.0.memory.total", True), ("gpus.0.index", -1), ("gpus.0.index", 4096),
          ("gpus.0.processes.0.used_memory", "1 GiB"), ("gpus.0.processes.0.used_memory", -1),
          ("gpus.0.processes.0.pid", 0), ("gpus.0.processes.0.pid", "42"), ("gpus.0.processes.0.kind", "evil"),
          ("gpus.0.processes.0.visible", "yes"), ("gpus.0.processes.0.uid", -1), ("gpus.0.processes", {}),
          ("gpus.0.utilization_pct", 101), ("gpus.0.power_w", "NaN"), ("gpus.0.processes.0.command", 7),
          ("taken_at", "yesterday"), ("taken_at", 1.0), ("warnings", [1]), ("gpus", None), ("host", None),
          ("gpus.0.processes.0.mps_server", -3), ("launchers.0.pid", 0)]


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(_WRONG))
def test_a_status_field_of_the_wrong_type_or_range_is_a_bad_document(wrong):
    """Issue 32: "used": "12" was a TypeError traceback in the status table, -5 and 1.5 were shown as
    sizes. Every field is checked where the record is read: a BadDocument naming it."""
    from gpuslate.errors import BadDocument

    where, value = wrong
    doc = {"schema": "gpuslate.status.v1", "host": "h", "backend": "sim", "driver_version": None,
           "taken_at": "2026-12-01T10:11:12.345Z", "warnings": [], "host_processes": [],
           "launchers": [{"pid": 7, "user": "u", "command": "c"}],
           "gpus": [{"index": 0, "uuid": None, "name": None, "error": None, "pstate": None,
                     "memory": {"total": 100, "used": 10, "reserved": 0, "free": 90}, "utilization_pct": 1,
                     "temperature_c": 30, "power_w": 1.0, "power_limit_w": 2.0,
                     "processes": [{"pid": 9, "start_ticks": 1, "kind": "compute", "used_memory": 10, "user": "u",
                                    "uid": 0, "name": "n", "command": "c", "started": None, "ppid": 1, "pgid": 9,
                                    "sid": 9, "root_pid": 9, "state": "S", "container": None, "cgroup": None,
                                    "visible": True, "daemon": None, "mps_server": None, "daemon_unproven": None}]}]}
    Snapshot.from_json(doc)  # the document as written reads
    node = doc
    *parents, leaf = where.split(".")
    for key in parents:
        node = node[int(key)] if key.isdigit() else node[key]
    node[int(leaf) if leaf.isdigit() else leaf] = value
    with pytest.raises(BadDocument) as err:
        Snapshot.from_json(doc)
    path = where.replace(".0.", "[0].").replace(".0", "[0]")
    assert path.split(".")[-1].split("[")[0] in str(err.value) and "Traceback" not in str(err.value), err.value
