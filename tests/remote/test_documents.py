"""Remote documents back into values: a round trip through to_json() gives the same document,
so the renderers see what a local run would have given them."""

from __future__ import annotations

from gpuslate.gpu import open_backend
from gpuslate.host.snapshot import take_snapshot
from gpuslate.remote.documents import clear_result, snapshot
from gpuslate import clear


def test_status_document_round_trip(sim_host, hold):
    hold("--memory", "5GiB", "--gpus", "0,3", "--workers", "2", "--orphan-workers")
    hold("--memory", "0", "--gpus", "1")  # a device-handle holder
    doc = take_snapshot(open_backend(str(sim_host.root))).to_json()
    assert any(p["kind"] == "handle" for g in doc["gpus"] for p in g["processes"])
    assert snapshot(doc).to_json() == doc


def test_clear_document_round_trip(sim_host, hold):
    hold("--memory", "0", "--gpus", "2", "--title", "my-monitor")  # spared
    h = hold("--memory", "6GiB", "--gpus", "0-1", "--workers", "2")
    for dry_run in (True, False):
        doc = clear(None, pids=[h.pid], grace=2, timeout=20, dry_run=dry_run, sim=str(sim_host.root)).to_json()
        assert doc["targets"] and doc["spared"]
        assert clear_result(doc).to_json() == doc
