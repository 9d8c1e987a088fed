"""Exact targeting on real GPUs (``pytest -m gpu`` on the device): a tensor-parallel job
across the GPUs next to another job; every process here is started by the test itself."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

import gpuslate
from gpuprocs import TORCH_HOLDER, TORCH_TP, start_python
from helpers import gpuslate_env

pytestmark = pytest.mark.gpu
GiB = 1024**3


def gone(pid: int) -> bool:
    from gpuslate.proc.procfs import read_stat

    st = read_stat(pid)
    return st is None or st.state == "Z"


def clear_cli(*args: str) -> tuple[int, dict, float]:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "gpuslate", "clear", "--json", "--yes", *args],
                       capture_output=True, text=True, env=gpuslate_env({"GPUSLATE_SIM": ""}), timeout=180)
    wall = time.perf_counter() - t0
    assert r.stdout, r.stderr
    return r.returncode, json.loads(r.stdout), wall


def test_clear_pid_of_a_tp_launcher_leaves_the_other_job(started):
    n = gpuslate.status().gpus.__len__()
    gpus = "0,1" if n >= 2 else "0,0"  # one GPU: both ranks share it
    tp = start_python(TORCH_TP, gpus, str(20 * GiB), timeout=300)
    other = start_python(TORCH_HOLDER, str(10 * GiB))  # on GPU 0, beside rank 0
    started += [tp, other]
    code, plan, _ = clear_cli("--pid", str(tp.pid), "--dry-run")
    assert code == 0
    assert {t["pid"] for t in plan["targets"]} == {tp.pid, *tp.children}
    assert other.pid not in {t["pid"] for t in plan["targets"]}
    assert sorted(plan["gpus"]) == sorted({int(g) for g in gpus.split(",")})  # the job's GPUs, not all
    code, doc, wall = clear_cli("--pid", str(tp.pid), "--timeout", "60")
    by_role = {t["pid"]: t["role"] for t in doc["targets"]}
    print(f"\nTP job on GPUs {gpus} + another job on GPU 0: exit {code} in {wall:.3f} s; "
          f"timings={doc['timings']}; roles={by_role}; spared={[(s['pid'], s['reason']) for s in doc['spared']]}")
    assert code == 0, doc
    assert by_role == {tp.pid: "launcher", **dict.fromkeys(tp.children, "holder")}
    assert all(gone(p) for p in (tp.pid, *tp.children)) and not gone(other.pid)
    assert doc["timings"]["total_s"] < 10  # as soon as the job's memory is freed, not the timeout
    after = gpuslate.status()
    assert any(q.pid == other.pid and q.kind == "compute" for q in after.gpus[0].processes)


def test_job_on_another_gpu_is_reported_with_its_gpu_and_memory(started):
    if len(gpuslate.status().gpus) < 2:
        pytest.skip("needs two GPUs: a job on GPU 1 seen from GPU 0")
    job = start_python(TORCH_TP, "1", str(20 * GiB), timeout=300)
    started.append(job)
    code, doc, _ = clear_cli("--gpus", "0", "--dry-run")
    (worker,) = job.children
    spared = {s["pid"]: s["reason"] for s in doc["spared"]}
    print(f"\nspared for --gpus 0: {spared}")
    assert code == 0 and worker in spared
    assert spared[worker].startswith("holds ") and "on GPU 1 (not selected)" in spared[worker]
    assert all(t["pid"] != worker for t in doc["targets"])
