"""Documents from peers, field by field (issue 32): a host whose status document has a field of the
wrong type or out of range (``"used": "12"``, ``-5``, ``1.5``, a pid of 0, a kind no driver reports)
is that host's ``bad_document``, one line naming the field: exit 2 alone, 7 in a fleet with a good
host. Never a traceback in the table (``"12"`` was one), never a negative size on the screen (``-5 B``).

The hosts are a fake ``ssh`` on PATH that prints each host's document: what is tested is the reading
of the document, not the transport (tests/remote runs real sshd for that).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import SRC

FAKE_SSH = """#!{python}
import os, sys
host = sys.argv[-2]  # ssh [options] HOST LINE
with open(os.path.join({docs!r}, host + ".json"), "rb") as f:
    sys.stdout.buffer.write(f.read())
"""

GOOD = {"schema": "gpuslate.status.v1", "host": "h", "backend": "sim", "driver_version": None,
        "taken_at": "2026-12-01T10:11:12.345Z", "warnings": [], "host_processes": [], "launchers": [],
        "gpus": [{"index": 0, "uuid": None, "name": "Sim", "error": None, "pstate": None,
                  "memory": {"total": 100 << 30, "used": 10 << 30, "reserved": 0, "free": 90 << 30},
                  "utilization_pct": 1, "temperature_c": 30, "power_w": 1.0, "power_limit_w": 2.0,
                  "processes": [{"pid": 9, "start_ticks": 1, "kind": "compute", "used_memory": 10 << 30,
                                 "user": "u", "uid": 1000, "name": "python", "command": "python serve.py",
                                 "started": None, "ppid": 1, "pgid": 9, "sid": 9, "root_pid": 9, "state": "S",
                                 "container": None, "cgroup": None, "visible": True, "daemon": None,
                                 "mps_server": None, "daemon_unproven": None}]}]}


def _bad(path: str, value: object) -> dict:
    doc = copy.deepcopy(GOOD)
    node = doc
    *parents, leaf = path.split(".")
    for key in parents:
        node = node[int(key)] if key.isdigit() else node[key]
    node[leaf] = value
    return doc


SHAPES = {
    "used-string": ("gpus.0.memory.used", "12"), "used-negative": ("gpus.0.memory.used", -5),
    "used-fraction": ("gpus.0.memory.used", 1.5), "proc-memory-negative": ("gpus.0.processes.0.used_memory", -5),
    "pid-zero": ("gpus.0.processes.0.pid", 0), "kind-unknown": ("gpus.0.processes.0.kind", "evil"),
    "index-string": ("gpus.0.index", "0"), "taken-at-garbage": ("taken_at", "yesterday"),
}


@pytest.fixture
def fleet(tmp_path: Path) -> dict[str, str]:
    """The environment of a gpuslate whose ssh is the fake: hosts 'good' and one per shape."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "good.json").write_text(json.dumps(GOOD))
    for name, (path, value) in SHAPES.items():
        (docs / f"{name}.json").write_text(json.dumps(_bad(path, value)))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(FAKE_SSH.format(python=sys.executable, docs=str(docs)))
    (bin_dir / "ssh").chmod(0o755)
    control = tmp_path / "ssh-control"
    control.mkdir(mode=0o700)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}", "PYTHONPATH": SRC,
            "GPUSLATE_SSH_CONTROL_DIR": str(control)}


def gs(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuslate", *args], capture_output=True, text=True, env=env,
                          timeout=60, stdin=subprocess.DEVNULL)


def test_the_good_document_is_shown(fleet):
    r = gs(fleet, "-H", "good", "status")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "10.0 GiB" in r.stdout


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_field_of_the_wrong_type_or_range_is_the_hosts_bad_document(fleet, shape):
    path, _ = SHAPES[shape]
    for args in (("status",), ("status", "--json")):
        r = gs(fleet, "-H", shape, *args)
        assert r.returncode == 2, (r.stdout[-800:], r.stderr[-800:])
        assert "Traceback" not in r.stdout + r.stderr and " -5 B" not in r.stdout
        out = r.stdout + r.stderr
        assert "bad_document" in out and path.rsplit(".", 1)[-1] in out, out[-800:]


def test_in_a_fleet_the_bad_hosts_fail_and_the_good_one_is_shown(fleet):
    r = gs(fleet, "-H", "good", *[w for s in sorted(SHAPES) for w in ("-H", s)], "status", "--json")
    assert r.returncode == 7, r.stderr
    hosts = {h["host"]: h for h in json.loads(r.stdout)["hosts"]}
    assert hosts["good"]["ok"] and hosts["good"]["result"]["gpus"][0]["memory"]["used"] == 10 << 30
    for shape, (path, _) in SHAPES.items():
        err = hosts[shape]["error"]
        assert not hosts[shape]["ok"] and err["type"] == "bad_document" and hosts[shape]["exit_code"] == 2
        assert path.rsplit(".", 1)[-1] in err["message"], err
