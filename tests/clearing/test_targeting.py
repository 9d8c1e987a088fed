"""Exact targeting with real processes on a simulated host: what the plan shows is
exactly what is signaled (issue 7's reproductions, each as a test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from helpers import gpuslate_env, is_gone, wait_for


def alive(pid: int) -> bool:
    return not is_gone(pid)


def clear_json(cli, *args: str, timeout: float = 60) -> tuple[int, dict, str]:
    r = cli("clear", "--json", "--yes", *args, timeout=timeout)
    assert r.stdout, r.stderr
    return r.returncode, json.loads(r.stdout), r.stderr


def check_contract(doc: dict) -> None:
    """Invariants of every clear document: one verdict per process, spared never signaled."""
    targets = [t["pid"] for t in doc["targets"]]
    spared = [s["pid"] for s in doc["spared"]]
    assert len(targets) == len(set(targets)) and len(spared) == len(set(spared))
    assert not set(targets) & set(spared), (targets, spared)


def test_pid_1_is_refused_and_nothing_is_signaled(sim_host, hold, cli):
    a = hold("--memory", "1GiB", "--gpus", "0", "--title", "job-A")
    b = hold("--memory", "1GiB", "--gpus", "5", "--title", "job-B")
    for extra in ([], ["--all-users"]):
        r = cli("clear", "--pid", "1", "--yes", *extra)
        assert r.returncode == 2, r.stderr
        assert r.stderr.strip().splitlines() == ["gpuslate: error: PID 1 is never a target"]
        assert alive(a.pid) and alive(b.pid)


def test_pid_of_an_ancestor_of_gpuslate_is_refused(sim_host, hold, cli):
    a = hold("--memory", "1GiB", "--gpus", "0")
    r = cli("clear", "--pid", str(os.getpid()), "--yes")  # this test runs the gpuslate that is asked
    assert r.returncode == 2
    assert f"{os.getpid()} is an ancestor of this gpuslate" in r.stderr and "Traceback" not in r.stderr
    assert alive(a.pid)


def test_pid_that_does_not_exist_or_holds_nothing(sim_host, hold, cli):
    a = hold("--memory", "1GiB", "--gpus", "0")
    sleeper = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        r = cli("clear", "--pid", str(sleeper.pid), "--yes")
        assert r.returncode == 2 and "holds none of the selected GPUs" in r.stderr
        r = cli("clear", "--pid", "4194304", "--yes")
        assert r.returncode == 2 and "does not exist" in r.stderr
        assert alive(a.pid) and sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_clear_pid_child_spares_the_callers_other_children(sim_host):
    """A program (a pytest fixture, say) starts a holder and an unrelated sleep, then
    clears the holder: its other child lives."""
    code = textwrap.dedent("""
        import json, subprocess as s, sys
        h = s.Popen([sys.executable, "-m", "gpuslate", "sim", "hold", "--memory", "1GiB", "--gpus", "4"],
                    stdout=s.PIPE)
        h.stdout.readline()
        z = s.Popen(["sleep", "300"])
        r = s.run([sys.executable, "-m", "gpuslate", "clear", "--pid", str(h.pid), "--gpus", "4", "--yes",
                   "--json"], capture_output=True, text=True)
        h.wait()
        print(json.dumps({"code": r.returncode, "doc": json.loads(r.stdout), "sleep": z.poll(), "h": h.pid,
                          "z": z.pid}))
        z.kill()
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=gpuslate_env(),
                       timeout=60)
    out = json.loads(r.stdout)
    assert out["code"] == 0, r.stderr
    assert out["sleep"] is None  # still running when clear returned
    assert [t["pid"] for t in out["doc"]["targets"]] == [out["h"]]
    check_contract(out["doc"])


def test_handle_only_monitor_in_the_jobs_group_is_spared_not_signaled(sim_host, tmp_path, cli):
    script = tmp_path / "g.sh"
    script.write_text(f"{sys.executable} -m gpuslate sim hold --memory 0 --gpus 4 --title mon &\n"
                      f"{sys.executable} -m gpuslate sim hold --memory 1GiB --gpus 4 &\nwait\n")
    launcher = subprocess.Popen(["bash", str(script)], env=gpuslate_env(), start_new_session=True,
                                stdout=subprocess.PIPE, text=True)
    try:
        ready = [json.loads(launcher.stdout.readline()) for _ in range(2)]
        pids = {r["pid"] for r in ready}
        wait_for(lambda: len(_holders(sim_host, 4)) == 2)
        mon = next(p for p in pids if _name(p) == "mon")
        job = (pids - {mon}).pop()
        code, doc, err = clear_json(cli, "--gpus", "4")
        assert code == 0, (doc, err)
        check_contract(doc)
        roles = {t["pid"]: t["role"] for t in doc["targets"]}
        assert roles == {job: "holder", launcher.pid: "launcher"}
        (s,) = [s for s in doc["spared"] if s["pid"] == mon]
        assert "device handle only" in s["reason"] and s["job"] == launcher.pid
        assert alive(mon) and is_gone(job)
    finally:
        subprocess.run(["pkill", "-KILL", "-s", str(launcher.pid)])
        launcher.wait()


def test_match_one_rank_brings_the_whole_tp_job_none_of_it_spared(sim_host, hold, cli):
    h = hold("--memory", "4GiB", "--gpus", "4,5", "--workers", "2", "--title", "sglang::scheduler_TP{rank}")
    tp0 = next(p for p in h.workers if _cmdline(p).endswith("TP0"))
    code, plan, _ = clear_json(cli, "--match", "TP0$", "--dry-run")
    code, doc, err = clear_json(cli, "--match", "TP0$")
    # the dry run is the act: the same targets in the same roles, each signaled, nothing else
    assert [(t["pid"], t["role"]) for t in plan["targets"]] == [(t["pid"], t["role"]) for t in doc["targets"]]
    assert all(t["signals"] for t in doc["targets"]) and plan["spared"] == doc["spared"]
    assert code == 0, (doc, err)
    check_contract(doc)
    roles = {t["pid"]: t["role"] for t in doc["targets"]}
    assert set(roles) == set(h.pids)
    assert roles[tp0] == "holder" and roles[h.pid] == "launcher"
    assert all(roles[w] == "job member" for w in h.workers if w != tp0)
    assert doc["gpus"] == [4, 5]  # verified where the job held memory
    assert all(is_gone(p) for p in h.pids)


def test_pid_without_gpus_verifies_only_the_jobs_gpus(sim_host, hold, cli):
    a = hold("--memory", "2GiB", "--gpus", "0")
    b = hold("--memory", "2GiB", "--gpus", "5")
    t0 = time.monotonic()
    code, doc, err = clear_json(cli, "--pid", str(a.pid), "--timeout", "30")
    assert code == 0, (doc, err)
    assert time.monotonic() - t0 < 10 and doc["timings"]["total_s"] < 5
    assert doc["gpus"] == [0] and [t["pid"] for t in doc["targets"]] == [a.pid]
    assert is_gone(a.pid) and alive(b.pid)


def test_pid_on_a_shared_gpu_waits_only_for_the_selected_jobs_memory(sim_host, hold, cli):
    """Another job beside the selected one on the same GPU: the GPU never becomes free, but the
    selected job's memory is released, and that is what a clear of selected jobs verifies."""
    a = hold("--memory", "20GiB", "--gpus", "0,1", "--workers", "2")
    b = hold("--memory", "10GiB", "--gpus", "0")
    code, doc, err = clear_json(cli, "--pid", str(a.pid), "--timeout", "30")
    assert code == 0, (doc, err)
    assert doc["verify"] == "released" and doc["gpus"] == [0, 1] and doc["timings"]["total_s"] < 5
    assert all(is_gone(p) for p in a.pids) and alive(b.pid)
    (g0,) = [m for m in doc["after"] if m["gpu"] == 0]
    assert g0["processes"] == [b.pid] and g0["used"] == 10 * 2**30


def test_held_by_non_targets_fails_fast_with_the_diagnosis(sim_host, hold, cli):
    daemon = hold("--memory", "3GiB", "--gpus", "6", program="nv-hostengine")
    job = hold("--memory", "2GiB", "--gpus", "6")
    t0 = time.monotonic()
    code, doc, err = clear_json(cli, "--gpus", "6", "--timeout", "60")
    took = time.monotonic() - t0
    assert code == 4 and doc["status"] == "held_by_others", (doc, err)
    assert took < 2.5, took
    assert is_gone(job.pid) and alive(daemon.pid)
    (d,) = doc["diagnosis"]
    (p,) = d["problems"]
    assert p["pid"] == daemon.pid and "GPU daemon" in p["reason"] and "--include-handles" in p["remedy"]
    # with nothing to end at all, the answer is as quick
    t0 = time.monotonic()
    code, doc, _ = clear_json(cli, "--gpus", "6", "--timeout", "60")
    assert code == 4 and doc["targets"] == [] and time.monotonic() - t0 < 2.5


def test_job_on_another_gpu_is_named_with_its_gpu_and_memory(sim_host, hold, cli):
    # CUDA opens every device node: a job computing on GPU 1 holds a handle on GPU 0
    job = hold("--memory", "20GiB", "--gpus", "1", "--handles", "0")
    code, doc, err = clear_json(cli, "--gpus", "0", "--dry-run")
    assert code == 0, err
    (s,) = doc["spared"]
    assert s["pid"] == job.pid and s["reason"] == "holds 20.0 GiB on GPU 1 (not selected)"
    assert doc["targets"] == [] and alive(job.pid)


def test_namespace_init_that_drops_sigterm_is_killed_early(sim_host, cli):
    if subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True).returncode != 0:
        pytest.skip("unshare --pid is not permitted here")  # CI runs as root, where it is
    p = subprocess.Popen(["unshare", "--pid", "--fork", sys.executable, "-m", "gpuslate", "sim", "hold",
                          "--memory", "2GiB", "--gpus", "2"], stdout=subprocess.PIPE, text=True,
                         env=gpuslate_env(), start_new_session=True)
    try:
        holder = json.loads(p.stdout.readline())["pid"]
        code, plan, _ = clear_json(cli, "--pid", str(p.pid), "--dry-run")
        by_pid = {t["pid"]: t for t in plan["targets"]}
        assert "PID 1 of its PID namespace" in by_pid[holder]["ignores_sigterm"]
        assert by_pid[p.pid]["ignores_sigterm"] is None
        code, doc, err = clear_json(cli, "--pid", str(p.pid), "--grace", "5")
        assert code == 0, (doc, err)
        t = {t["pid"]: t for t in doc["targets"]}[holder]
        assert [s["signal"] for s in t["signals"]] == ["SIGTERM", "SIGKILL"]
        assert t["signals"][1]["at_s"] < 2 and doc["timings"]["total_s"] < 3  # well within the grace
        assert is_gone(holder)
    finally:
        p.kill()
        p.wait()


def test_what_the_job_forks_while_stopping_is_signaled_and_reported(sim_host, tmp_path, cli):
    """A launcher whose SIGTERM handler starts a cleanup helper: the helper is ended too,
    reported with its own role."""
    script = tmp_path / "launch.sh"
    marker = tmp_path / "helper.pid"
    script.write_text(textwrap.dedent(f"""\
        trap 'sleep 300 & echo $! > {marker}; wait' TERM
        {sys.executable} -m gpuslate sim hold --memory 1GiB --gpus 3 &
        wait
    """))
    launcher = subprocess.Popen(["bash", str(script)], env=gpuslate_env(), start_new_session=True,
                                stdout=subprocess.PIPE, text=True)
    try:
        json.loads(launcher.stdout.readline())
        code, doc, err = clear_json(cli, "--gpus", "3", "--grace", "3")
        assert code == 0, (doc, err)
        check_contract(doc)
        helper = int(marker.read_text())
        forked = [t for t in doc["targets"] if t["role"] == "forked while stopping"]
        assert [t["pid"] for t in forked] == [helper] and forked[0]["signals"]
        assert is_gone(helper) and is_gone(launcher.pid)
    finally:
        subprocess.run(["pkill", "-KILL", "-s", str(launcher.pid)])
        launcher.wait()


def test_holders_only_leaves_the_launcher(sim_host, hold, cli):
    h = hold("--memory", "2GiB", "--gpus", "0,1", "--workers", "2")
    code, doc, err = clear_json(cli, "--gpus", "0", "--holders-only")
    assert code == 0, (doc, err)
    assert [t["role"] for t in doc["targets"]] == ["holder"]
    assert alive(h.pid)


def _holders(sim_host, gpu: int) -> list:
    import gpuslate

    return gpuslate.status([gpu]).gpus[0].processes


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").decode()


def _name(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()
