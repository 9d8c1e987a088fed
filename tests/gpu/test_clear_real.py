"""`clear` against real CUDA processes on a real GPU (``pytest -m gpu`` on the device).

Every target is selected by --pid: the tests only ever end processes they started.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

import gpuslate
from gpuprocs import NVML_MONITOR, TORCH_HOLDER, TORCH_LEADER_EXITS, TORCH_TREE, start_python
from helpers import gpuslate_env, wait_for

pytestmark = pytest.mark.gpu
GiB = 1024**3


def gone(pid: int) -> bool:
    from gpuslate.proc.procfs import read_stat

    st = read_stat(pid)
    return st is None or st.state == "Z"


def test_clear_one_process_holding_100_gib(started):
    p = start_python(TORCH_HOLDER, str(110 * GiB))
    started.append(p)
    before = gpuslate.status([0]).gpus[0]
    assert before.memory.used >= 110 * GiB
    t0 = time.perf_counter()
    r = gpuslate.clear([0], pids=[p.pid], grace=10, timeout=60)
    wall = time.perf_counter() - t0
    print(f"\n1 x 110 GiB: status={r.status} timings={r.timings} wall={wall:.3f}s")
    assert r.ok and gone(p.pid)
    assert gpuslate.status([0]).gpus[0].memory.used <= r.max_used  # not a false clean


def test_clear_eight_process_tree(started):
    p = start_python(TORCH_TREE, "8", str(15 * GiB), TORCH_HOLDER, timeout=300)
    started.append(p)
    snap = gpuslate.status([0])
    pids = {q.pid for q in snap.gpus[0].processes if q.kind == "compute"}
    assert set(p.children) <= pids
    assert all(q.root_pid == p.pid for q in snap.gpus[0].processes if q.pid in p.children)
    r = gpuslate.clear([0], pids=[p.children[3]], grace=10, timeout=120)
    print(f"\n8 x 15 GiB tree: status={r.status} timings={r.timings} targets={len(r.plan.targets)}")
    assert r.ok
    assert {t.ident.pid for t in r.plan.targets} == {p.pid, *p.children}
    assert all(gone(x) for x in [p.pid, *p.children])


def test_a_holder_whose_main_thread_exited_is_alive_and_cleared(started):
    """NVML names the process (the tgid) whose leader /proc reads as Z: status shows it holding, wait
    does not call it a zombie, clear ends it and verifies (issue 24)."""
    from gpuslate.proc.procfs import read_stat

    p = start_python(TORCH_LEADER_EXITS, str(2 * GiB))
    started.append(p)
    wait_for(lambda: read_stat(p.pid).leader_exited)
    (q,) = [q for q in gpuslate.status([0]).gpus[0].processes if q.pid == p.pid]
    assert q.kind == "compute" and q.used_memory and q.state != "Z" and q.visible
    waited = gpuslate.wait_free([0], timeout=0.1)
    mine = [pr for d in waited.diagnosis for pr in d.problems if pr.pid == p.pid]
    assert mine and not any("zombie" in pr.reason for pr in mine), mine
    r = gpuslate.clear([0], pids=[p.pid], grace=10, timeout=60)
    print(f"\nleader exited: status={r.status} ended_by={[x.ended_by for x in r.results]}")
    assert r.ok and [t.ident.pid for t in r.plan.targets] == [p.pid] and gone(p.pid)


def test_sigterm_ignoring_process_is_killed(started):
    p = start_python(TORCH_HOLDER, str(4 * GiB), "ignore-term")
    started.append(p)
    r = gpuslate.clear([0], pids=[p.pid], grace=0.5, timeout=60)
    (res,) = r.results
    print(f"\nignore-term: signals={[(s.signal, round(s.at, 3)) for s in res.signals]} ended_by={res.ended_by}")
    assert r.ok and res.ended_by == "SIGKILL" and [s.signal for s in res.signals] == ["SIGTERM", "SIGKILL"]


def test_handle_only_monitor_survives(started):
    mon = start_python(NVML_MONITOR)
    job = start_python(TORCH_HOLDER, str(2 * GiB))
    started += [mon, job]
    r = subprocess.run([sys.executable, "-m", "gpuslate", "clear", "--gpus", "0", "--pid", str(job.pid),
                        "--pid", str(mon.pid), "--json"], capture_output=True, text=True,
                       env=gpuslate_env({"GPUSLATE_SIM": ""}), timeout=120)
    doc = json.loads(r.stdout)
    print(f"\nmonitor spared: {[(s['pid'], s['reason'][:40]) for s in doc['spared']]}")
    assert r.returncode == 0, r.stderr
    assert [t["pid"] for t in doc["targets"]] == [job.pid]
    assert any(s["pid"] == mon.pid and "device handle" in s["reason"] for s in doc["spared"])
    assert not gone(mon.pid) and gone(job.pid)
