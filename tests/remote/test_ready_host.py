"""`up --ready-host` (was `--host`, now the global remote-host option) and `ready_host` in gpuslate.toml."""

from __future__ import annotations

import json
import sys

import pytest

from gpuslate.errors import UsageError
from gpuslate.units.spec import load_config, resolve
from sshd_hosts import free_port


def test_ready_host_in_toml_and_the_old_key_refused(tmp_path):
    cfg = tmp_path / "gpuslate.toml"
    cfg.write_text('[units.a]\ncommand = "srv"\nport = 8000\nready_host = "::1"\nengine = "vllm"\n')
    spec = resolve("a", config=str(cfg))
    assert spec.ready_host == "::1" and spec.readiness == ("vllm", "http://[::1]:8000/health")
    cfg.write_text('[units.a]\ncommand = "srv"\nport = 8000\nhost = "::1"\n')
    with pytest.raises(UsageError, match="unknown key 'host'"):
        load_config(cfg)


def test_up_ready_host_option(sim_host, tmp_path, monkeypatch, cli):
    monkeypatch.setenv("GPUSLATE_LOCK_DIR", str(tmp_path / "locks"))
    port = free_port()
    serve = [sys.executable, "-m", "gpuslate", "sim", "serve", "--port", str(port), "--startup-seconds", "0",
             "--memory", "1GiB"]
    env = {"GPUSLATE_LOCK_DIR": str(tmp_path / "locks")}
    try:
        r = cli("up", "rh", "--gpus", "0", "--port", str(port), "--ready-host", "127.0.0.1", "--json", "--", *serve,
                env=env)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["readiness"]["kind"] == "tcp"
        assert "127.0.0.1" in json.loads(r.stdout)["readiness"]["target"]
    finally:
        cli("down", "rh", env=env)
    # --host after 'up' is the remote host now: a bad one is refused as a host, before anything starts
    r = cli("up", "rh", "--host", "not a host", "--port", str(port), "--", "true", env=env)
    assert r.returncode == 2 and "invalid host" in r.stderr
