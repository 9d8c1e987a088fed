"""`gpuslate logs NAME --json` prints the gpuslate.logs.v1 document (issue 17, item 8)."""

from __future__ import annotations

import json
import sys

from expkit import free_port, kill_leftovers
from helpers import run_cli


def test_logs_json_of_a_real_unit(sim_host, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUSLATE_LOCK_DIR", str(tmp_path / "locks"))
    port = free_port()
    try:
        up = run_cli("up", "srv", "--gpus", "0", "--port", str(port), "--engine", "sglang", "--", sys.executable,
                     "-m", "gpuslate", "sim", "serve", "--port", str(port), "--memory", "1GiB",
                     "--startup-seconds", "0", timeout=60)
        assert up.returncode == 0, up.stderr
        r = run_cli("logs", "srv", "--json", "--tail", "1")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["schema"] == "gpuslate.logs.v1" and doc["name"] == "srv" and doc["running"]
        assert doc["lines"] == ["The server is fired up and ready to roll!"] or \
            doc["lines"][-1].endswith("ready to roll!"), doc
        r = run_cli("logs", "srv", "--json", "--follow")
        assert r.returncode == 2 and "without --follow" in r.stderr and json.loads(r.stdout)["error"]["type"] == "usage"
        assert run_cli("down", "srv").returncode == 0
    finally:
        kill_leftovers(sim_host, [tmp_path / "state"])
    r = run_cli("logs", "nosuch", "--json")
    assert r.returncode == 2 and json.loads(r.stdout)["error"]["type"] == "usage"
