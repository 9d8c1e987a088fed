"""Each readiness kind, through the library API: the simulated server answers like SGLang
(/health_generate) and like vLLM (/health, /v1/models), logs SGLang's line, and serves completions."""

from __future__ import annotations

import json

import pytest

from gpuslate import Host
from gpuslate.units import UnitSpec
from gpuslate.units.lifecycle import DownResult, UpResult
from gpuslate.units.listing import PsResult
from gpuslate.units.readiness import http
from unitkit import free_port, serve_cmd


def up(spec: UnitSpec) -> UpResult:
    with Host.open() as host:  # the simulated host of the units_host fixture
        return host.up(spec)


def down(name: str) -> DownResult:
    with Host.open() as host:
        return host.down(name)


def list_units() -> PsResult:
    with Host.open() as host:
        return host.ps()

KINDS = {
    "sglang": {"engine": "sglang"},
    "vllm": {"engine": "vllm"},
    "http": {"ready_url": "/v1/models"},
    "log": {"ready_log": r"fired up and ready to roll"},
    "smoke": {"engine": "sglang", "smoke": True},
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_readiness_kind_waits_for_the_real_thing(units_host, kind):
    port = free_port()
    spec = UnitSpec(f"r-{kind}", command=serve_cmd(port, startup=0.4), gpus=[0, 1], port=port, **KINDS[kind])
    result = up(spec)
    try:
        assert result.ok, result.to_json()
        assert result.readiness["kind"] == ("sglang" if kind == "smoke" else kind)
        # ready means serving: the server itself says so, not merely listening
        info = json.loads(http("GET", f"http://127.0.0.1:{port}/get_server_info")[1])
        assert info["status"] == "ready"
        t = result.time_to_ready
        assert t is not None and t >= 0.4  # never before the simulated load finished
        if kind == "smoke":
            assert result.smoke["ok"] and result.smoke["model"] == "sim-model"
            assert info["counters"]["requests_finished"] >= 2  # health_generate + the smoke completion
        assert list_units().get(spec.name).state == "ready"
    finally:
        assert down(spec.name).ok


def test_default_tcp_readiness_and_ready_url_with_path(units_host):
    port = free_port()
    spec = UnitSpec("tcp", command=serve_cmd(port, startup=0.2), gpus=[3], port=port)
    assert spec.readiness == ("tcp", f"127.0.0.1:{port}")
    result = up(spec)
    try:
        # the port is bound before loading starts: a TCP connect is the weakest check
        assert result.ok and result.readiness["kind"] == "tcp"
    finally:
        assert down("tcp").ok


def test_smoke_with_a_given_model_and_against_no_server(units_host):
    port = free_port()
    spec = UnitSpec("nosmoke", command=serve_cmd(port, "--model", "org/m-1", startup=0.1), gpus=[4], port=port,
                    engine="sglang", smoke=True, model="org/m-1")
    result = up(spec)
    assert result.ok and result.smoke["ok"] and result.smoke["model"] == "org/m-1"
    down("nosmoke")
    # a model the server does not serve fails the smoke test: the simulator answers 404
    # model_not_found, as vLLM does (issue 10)
    port = free_port()
    wrong = up(UnitSpec("wrongmodel", command=serve_cmd(port, startup=0.1), gpus=[4], port=port, engine="sglang",
                        smoke=True, model="no-such-model"))
    assert wrong.status == "smoke_failed" and "HTTP 404" in wrong.smoke["error"], wrong.smoke
    assert "model_not_found" in wrong.smoke["error"]
    # a server that is not there fails the smoke test
    from gpuslate.units.readiness import smoke

    gone = smoke(UnitSpec("x", command=["true"], port=free_port(), model="m"), timeout=1)
    assert not gone["ok"] and "smoke completion failed" in gone["error"]
