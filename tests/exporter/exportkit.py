"""Helpers for the exporter tests: the exporter as a real process, scrapes parsed by prometheus_client."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from helpers import gpuslate_env


class Exporter:
    """``gpuslate exporter --listen 127.0.0.1:0 --json`` started in a session of its own."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuslate", "exporter", "--listen", "127.0.0.1:0", "--json", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=gpuslate_env(env),
            start_new_session=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], 30)
        line = self.proc.stdout.readline() if ready else ""  # type: ignore[union-attr]
        if not line:
            self.proc.kill()
            raise AssertionError(f"the exporter did not start: {self.proc.communicate(timeout=10)[1]}")
        self.doc = json.loads(line)
        self.port: int = self.doc["port"]
        self.url = f"http://127.0.0.1:{self.port}"

    def get(self, path: str = "/metrics", timeout: float = 30) -> tuple[int, str, str]:
        """(status, content type, body) of one request."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
                return r.status, r.headers["Content-Type"], r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.headers["Content-Type"], e.read().decode()

    def scrape(self) -> dict[str, list[Sample]]:
        """One scrape, parsed by prometheus_client's own parser: samples by metric name."""
        status, _, text = self.get()
        assert status == 200
        out: dict[str, list[Sample]] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out.setdefault(s.name, []).append(s)
        return out

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
        try:
            return self.proc.wait(15)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


def value(samples: dict[str, list[Sample]], name: str, **labels: str) -> float | None:
    """The value of the one sample of ``name`` with ``labels`` (None: no such sample)."""
    found = [s.value for s in samples.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) <= 1, f"{name}{labels}: {len(found)} samples"
    return found[0] if found else None


KEY = ("gpu", "unit", "user", "slot")  # what joins gpuslate_process_memory_bytes and gpuslate_process_info


def process_series(samples: dict[str, list[Sample]]) -> dict[tuple[int, int], dict[str, str]]:
    """gpuslate_process_memory_bytes joined with gpuslate_process_info on their key, by (gpu, pid):
    the labels plus 'bytes'. Each memory series has exactly one info series and the other way round."""
    info = {tuple(s.labels[k] for k in KEY): s for s in samples.get("gpuslate_process_info", [])}
    memory = samples.get("gpuslate_process_memory_bytes", [])
    assert len(info) == len(samples.get("gpuslate_process_info", [])) == len(memory)
    assert all(s.value == 1 for s in info.values())
    out = {}
    for s in memory:
        assert set(s.labels) == set(KEY), s.labels  # nothing that changes at a restart
        i = info[tuple(s.labels[k] for k in KEY)]
        out[(int(s.labels["gpu"]), int(i.labels["pid"]))] = {**i.labels, "bytes": str(int(s.value))}
    return out


def need_tools(*names: str) -> None:
    """Skip without the Debian prometheus package's tools, except in CI (CI=true), where a
    missing one fails: .ci/run installs them."""
    missing = [n for n in names if shutil.which(n) is None]
    if missing:
        msg = f"{', '.join(missing)} not installed (Debian package prometheus; .ci/run installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
