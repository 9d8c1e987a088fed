"""Renamed escapees of a unit on a real GPU (issue 24), through NVML: a server double-forks two
torch workers that call ``setsid`` and rename themselves as SGLang's schedulers do; one keeps its
environment (``SPT_NOENV=1``, set by ``up``) and is found and ended by ``down``; the other removes
``SPT_NOENV`` first, so its title is written over its environment: ``down`` names it as a stray
on the unit's GPU (never "released"), and ``down --clear`` ends it; NVML then shows neither.
Run on the device machine: PYTHONPATH=src python3 -m pytest -m gpu tests/gpu/test_renamed_real.py
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

SERVER = r'''
import json, os, sys, time
WORKER = """
import os, sys, time
if sys.argv[1] == "clobber":
    os.environ.pop("SPT_NOENV", None)
import setproctitle
setproctitle.setproctitle("sglang::scheduler_TP" + sys.argv[2])
import torch
x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda:0")
x.fill_(1)
torch.cuda.synchronize()
open(sys.argv[3] + ".tmp", "w").write(str(os.getpid()))
os.rename(sys.argv[3] + ".tmp", sys.argv[3])
while True:
    time.sleep(3600)
"""
out = sys.argv[1]
for rank, how in enumerate(("kept", "clobber")):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", WORKER, how, str(rank), os.path.join(out, how)])
        os._exit(0)
    os.wait()
while not all(os.path.exists(os.path.join(out, h)) for h in ("kept", "clobber")):
    time.sleep(0.05)
print("serving", flush=True)
time.sleep(3600)
'''


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    pytest.importorskip("torch")
    pytest.importorskip("setproctitle")
    monkeypatch.delenv("GPUSLATE_SIM", raising=False)
    monkeypatch.setenv("GPUSLATE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("GPUSLATE_LOCK_DIR", str(tmp_path / "locks"))
    out = tmp_path / "ready"
    out.mkdir()
    yield out
    for name in ("kept", "clobber"):  # only what this test started, by the pid it wrote
        try:
            os.kill(int((out / name).read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass


def test_renamed_torch_workers_are_ended_or_named_never_released(setup: Path, tmp_path: Path) -> None:
    import gpuslate
    from gpuslate.units import DownOptions, UnitSpec
    from gpuslate.units.lifecycle import DownStatus

    script = tmp_path / "server.py"
    script.write_text(SERVER)
    host = gpuslate.Host.open()
    spec = UnitSpec("renamed", command=[sys.executable, str(script), str(setup)], gpus=[0],
                    ready_log="serving", containment="session", start_timeout=300, grace=5)
    up = host.up(spec)
    assert up.ok, up.to_json()
    kept, clobber = (int((setup / n).read_text()) for n in ("kept", "clobber"))
    assert b"GPUSLATE_UNIT_ID=" in open(f"/proc/{kept}/environ", "rb").read()
    assert b"GPUSLATE_UNIT" not in open(f"/proc/{clobber}/environ", "rb").read()
    held = {p.pid for p in gpuslate.status([0]).gpus[0].processes if p.used_memory}
    assert {kept, clobber} <= held, held

    d = host.down("renamed", DownOptions(timeout=60))
    doc = d.to_json()
    print(json.dumps({k: doc[k] for k in ("verification", "strays", "timings")}, indent=2))
    assert d.status is DownStatus.NOT_RULED_OUT and doc["verification"] == "not_ruled_out"
    assert [s["pid"] for s in doc["strays"]] == [clobber] and doc["strays"][0]["reason"] == "unit_gpu"
    assert kept in [r["pid"] for r in doc["processes"] + doc["swept"]] and doc["memory_released"] is False
    assert host.ps().get("renamed").state.value == "orphaned"

    d = host.down("renamed", DownOptions(timeout=60, clear_strays=True))
    assert d.ok and d.report.released, d.to_json()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and {kept, clobber} & {p.pid for p in gpuslate.status([0]).gpus[0].processes}:
        time.sleep(0.2)
    assert not {kept, clobber} & {p.pid for p in gpuslate.status([0]).gpus[0].processes}
    assert host.ps().get("renamed").state.value == "stopped"
