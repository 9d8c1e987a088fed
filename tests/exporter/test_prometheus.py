"""A real Prometheus (Debian's ``prometheus``) scrapes the exporter every second on loopback;
its HTTP API returns the per-process series, loads the example alert rules, and answers
every query of the example dashboard."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from exportkit import need_tools
from helpers import wait_for
from test_docs import EXPORTER_DOCS, dashboard_queries

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    def __init__(self, folder: Path, target_port: int) -> None:
        self.port = free_port()
        config = folder / "prometheus.yml"
        config.write_text(json.dumps({  # JSON is YAML
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(EXPORTER_DOCS / "alerts.yml")],
            "scrape_configs": [{"job_name": "gpuslate",
                                "static_configs": [{"targets": [f"127.0.0.1:{target_port}"]}]}],
        }))
        self.log = open(folder / "prometheus.log", "w")
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def api(self, path: str, **params: str) -> dict:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.loads(r.read())

    def up(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited: {Path(self.log.name).read_text()[-2000:]}")
        try:
            targets = self.api("targets")["data"]["activeTargets"]
        except OSError:
            return False
        return bool(targets) and targets[0]["health"] == "up"

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


def test_prometheus_scrapes_the_per_process_series(sim_host, hold, exporter, tmp_path):
    need_tools("prometheus")
    job = hold("--memory", "8GiB", "--gpus", "0,1", "--workers", "2", "--title", 'vllm "worker"\\{rank}')
    lone = hold("--memory", "2GiB", "--gpus", "7")
    e = exporter()
    prom = Prometheus(tmp_path, e.port)
    try:
        wait_for(prom.up, timeout=60, interval=0.2)

        joined = ("gpuslate_process_memory_bytes * on (instance, gpu, unit, user, slot) "
                  "group_left (pid, command, job_pid) gpuslate_process_info")  # the info pattern, as documented

        def series() -> list[dict] | None:
            result = prom.api("query", query=joined)["data"]["result"]
            return result if len(result) == 3 else None

        result = wait_for(series, timeout=30, interval=0.2)
        by_pid = {int(r["metric"]["pid"]): r for r in result}
        assert by_pid.keys() == {*job.workers, lone.pid}
        for w in job.workers:
            m = by_pid[w]["metric"]
            assert m["job"] == "gpuslate" and m["instance"] == f"127.0.0.1:{e.port}" and m["slot"] in ("0", "1")
            assert int(m["job_pid"]) == job.pid and m["user"] and m["command"].startswith('vllm "worker"\\')
            assert float(by_pid[w]["value"][1]) == 8 * 1024**3
        assert by_pid[lone.pid]["metric"]["job_pid"] == str(lone.pid)

        groups = prom.api("rules")["data"]["groups"]
        assert [g["name"] for g in groups] == ["gpuslate"] and len(groups[0]["rules"]) == 6
        assert all(r["health"] in ("ok", "unknown") for r in groups[0]["rules"])

        for q in dashboard_queries():
            q = q.replace("$instance", ".*").replace("$__rate_interval", "1m")
            if q.startswith("label_values("):  # a Grafana function: the series behind it
                q = q[len("label_values("):].split(",")[0]
            doc = prom.api("query", query=q)
            assert doc["status"] == "success", (q, doc)
        used = prom.api("query", query='sum(gpuslate_process_memory_bytes{unit=""})')["data"]["result"]
        assert float(used[0]["value"][1]) == 2 * 8 * 1024**3 + 2 * 1024**3
    finally:
        prom.stop()
