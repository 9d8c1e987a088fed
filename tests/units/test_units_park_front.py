"""Parking behind a front (a real Caddy): ``swap --park`` between two resident deployments on distinct
ports loses no request, both ways and again; ``park`` alone makes the front answer 503 saying how
the unit comes back, and ``resume`` routes it again."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from frontkit import StreamLoad, summary
from gpuslate.api import Host
from gpuslate.errors import UsageError
from gpuslate.front.caddy import find_caddy
from gpuslate.gpu.simhost.host import SimHost
from gpuslate.units.front import front_store
from gpuslate.units.unit import load_units
from helpers import kill_leftovers, unavailable
from unitkit import free_port, run_units

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _caddy() -> None:
    try:
        find_caddy()
    except UsageError as exc:
        unavailable(f"the front tests need Caddy (the front extra): {exc}")


@pytest.fixture
def fronts_host(units_host: SimHost) -> Iterator[SimHost]:
    yield units_host
    with Host.open() as host:
        kill_leftovers(units_host, load_units(front_store(host)))


def serve(engine: str, port: int) -> list[str]:
    head = [sys.executable, "-m", "gpuslate", "sim", "serve", "--startup-seconds", "0.3", "--memory", "8GiB",
            "--sleep-seconds", "0.1", "--wake-seconds", "0.1", "--emulate", engine, "--"]
    if engine == "vllm":
        return [*head, "serve", "org/m", "--served-model-name", "sim-model", "--port", str(port),
                "--enable-sleep-mode"]
    return [*head, "--model-path", "org/m", "--served-model-name", "sim-model", "--port", str(port),
            "--enable-memory-saver", "--enable-weights-cpu-backup"]


def test_park_swaps_behind_a_front_lose_nothing(fronts_host: SimHost) -> None:
    pa, pb, fport = free_port(), free_port(), free_port()
    Path("gpuslate.toml").write_text(
        f'[units.a]\ncommand = {json.dumps(serve("vllm", pa))}\ngpus = "0"\nport = {pa}\nengine = "vllm"\n'
        f'env = {{ VLLM_SERVER_DEV_MODE = "1" }}\nfront = {fport}\n\n'
        f'[units.b]\ncommand = {json.dumps(serve("sglang", pb))}\ngpus = "0"\nport = {pb}\nengine = "sglang"\n')
    r = run_units("up", "a")
    assert r.returncode == 0, r.stderr
    with StreamLoad(f"http://127.0.0.1:{fport}", concurrency=6, max_tokens=16) as load:
        load.wait_done(12)
        for old, new in (("a", "b"), ("b", "a"), ("a", "b")):
            r = run_units("swap", old, new, "--park", "--json", timeout=120)
            doc = json.loads(r.stdout)
            assert r.returncode == 0 and doc["parked"]["status"] == "parked", r.stderr
            assert doc["front"]["state"] == "serving" and doc["front"]["unit"] == new
            load.wait_done(12)
        records = load.stop()
    assert not [x for x in records if not x.ok], summary(records)
    assert doc["switch"] == "park" and doc["resumed"]["answer"]["same"]

    r = run_units("park", "b", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["front"]["state"] == "refusing", r.stdout
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"http://127.0.0.1:{fport}/v1/models", timeout=10)
    assert refused.value.code == 503 and b"resume b" in refused.value.read()
    r = run_units("resume", "b", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["front"]["state"] == "serving", r.stdout
    with urllib.request.urlopen(f"http://127.0.0.1:{fport}/v1/models", timeout=10) as ok:
        assert ok.status == 200
    assert run_units("down", "a", "b").returncode == 0
