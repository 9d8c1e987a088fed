"""``park`` and ``resume`` on a simulated host, against the simulated engines' own park endpoints and
the simulated driver's checkpoint: each method proven by the readings, each guard refusing before
anything changes, each misbehaviour of the engines ending as docs/units.md says (a refusal, an undone
park, a fallback, or a named state), the phases recorded so that ``ps`` names what a killed gpuslate
left and ``resume`` or ``down`` ends it."""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from gpuslate import Host, UnitSpec
from gpuslate.gpu.simhost import SimBackend
from gpuslate.gpu.simhost.host import SimHost
from gpuslate.gpu.types import CheckpointState
from gpuslate.options import ParkOptions, ParkWay, SwapOptions
from gpuslate.units import store
from gpuslate.units.park import ParkStatus, ResumeStatus
from gpuslate.units.state import ParkPhase, UnitState
from gpuslate.units.swap import SwapStatus
from helpers import GiB, wait_for
from unitkit import free_port, popen_units, run_units

pytestmark = pytest.mark.slow  # real servers parked and resumed, some of them killed mid-way

SCHEMAS = Path(__file__).resolve().parents[2] / "docs" / "schemas"
DEV = {"VLLM_SERVER_DEV_MODE": "1"}


def sim(*extra: str, memory: str = "20GiB", sleep: float = 0.05, wake: float = 0.05) -> list[str]:
    return [sys.executable, "-m", "gpuslate", "sim", "serve", "--startup-seconds", "0.1", "--memory", memory,
            "--sleep-seconds", str(sleep), "--wake-seconds", str(wake), "--reload-seconds", "0.05", *extra]


def vllm(name: str, *args: str, gpus: tuple[int, ...] = (0,), simargs: tuple[str, ...] = (), env: dict | None = None,
         park: ParkWay = ParkWay.AUTO, **kw: Any) -> UnitSpec:
    port = free_port()
    return UnitSpec(name, command=[*sim(*simargs, **kw), "--emulate", "vllm", "--", "serve", f"org/{name}", "--port",
                                   str(port), "--enable-sleep-mode", *args],
                    gpus=list(gpus), port=port, engine="vllm", env={**DEV, **(env or {})}, park=park)


def sglang(name: str, *args: str, gpus: tuple[int, ...] = (0,), simargs: tuple[str, ...] = (), **kw: Any) -> UnitSpec:
    port = free_port()
    return UnitSpec(name, command=[*sim(*simargs, **kw), "--emulate", "sglang", "--", "--model-path", f"org/{name}",
                                   "--port", str(port), "--enable-memory-saver", *args],
                    gpus=list(gpus), port=port, engine="sglang")


def plain(name: str, gpus: tuple[int, ...] = (0,), memory: str = "10GiB") -> UnitSpec:
    """gpuslate's own simulated server: no engine park, one worker per GPU (the driver's checkpoint)."""
    port = free_port()
    return UnitSpec(name, command=[*sim(memory=memory), "--port", str(port)], gpus=list(gpus), port=port, engine="sim")


def used(root: Path, gpu: int) -> int:
    return next(r.memory.used for r in SimBackend(root).read([gpu], full=False))


def record(host: Host, name: str) -> store.UnitRecord:
    rec = store.UnitStore.of(host).load(name)
    assert rec is not None
    return rec


def state(host: Host, name: str) -> UnitState:
    u = host.ps().get(name)
    assert u is not None
    return u.state


def complete(spec: UnitSpec, max_tokens: int = 4, timeout: float = 30) -> dict[str, Any]:
    body = json.dumps({"model": f"org/{spec.name}", "prompt": "hi", "max_tokens": max_tokens}).encode()
    req = urllib.request.Request(spec.url("/v1/completions"), data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def running(spec: UnitSpec) -> float:
    """What the emulated vLLM's /metrics says runs."""
    with urllib.request.urlopen(spec.url("/metrics"), timeout=5) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:num_requests_running"))


@pytest.fixture
def host(units_host: SimHost):
    with Host.open(str(units_host.root)) as h:
        yield h


# -- the methods, proven ----------------------------------------------------------------------


def test_vllm_level1_parks_proven_and_resumes_with_the_same_answer(host, units_host):
    spec = vllm("a")
    assert host.up(spec).ok
    assert record(host, "a").reference is not None  # its engine can park it: the answer taken once ready
    p = host.park("a")
    assert p.status is ParkStatus.PARKED and p.method == "level1", p.to_json()
    assert p.proof is not None and p.proof.parked and "level 1" in p.why
    # the CUDA context and graphs stay (5% of 20 GiB); the weights went into host memory
    assert used(units_host.root, 0) == pytest.approx(1 * GiB, abs=64) and p.host_bytes == pytest.approx(8 * GiB, abs=64)
    ps = host.ps().get("a")
    assert ps.state is UnitState.PARKED and ps.park["method"] == "level1"
    assert ps.gpu_memory == pytest.approx(1 * GiB, abs=64)
    assert "8.0 GiB of host memory" in ps.park["line"]
    entries = host.audit().entries
    assert any(e["action"] == "park" and e["signal"] == "POST /sleep?level=1&mode=wait" and e["outcome"] == "delivered"
               for e in entries)
    assert host.park("a").status is ParkStatus.ALREADY_PARKED
    r = host.resume("a")
    assert r.status is ResumeStatus.RESUMED and r.answer["same"], r.to_json()
    assert used(units_host.root, 0) == 20 * GiB and state(host, "a") is UnitState.READY
    assert record(host, "a").park is None and host.resume("a").status is ResumeStatus.NOT_PARKED
    assert any(e["action"] == "resume" and e["signal"] == "POST /wake_up" for e in host.audit().entries)


def test_sglang_without_cpu_backup_parks_at_level2_and_reloads_its_weights(host, units_host):
    spec = sglang("s")
    assert host.up(spec).ok
    p = host.park("s")
    assert p.status is ParkStatus.PARKED and p.method == "level2" and p.host_bytes == 0, p.to_json()
    assert used(units_host.root, 0) < 1 * GiB  # only the CUDA context stays (cuda_graph released too)
    r = host.resume("s")
    assert r.status is ResumeStatus.RESUMED and r.answer["same"], r.to_json()  # loaded again from disk
    signals = [e["signal"] for e in host.audit().entries if e["action"] == "resume"]
    assert signals == ["POST /resume_memory_occupation", "POST /update_weights_from_disk"]


def test_the_drivers_checkpoint_of_a_one_process_server(host, units_host):
    assert host.up(plain("c", gpus=(2,))).ok
    p = host.park("c")
    assert p.status is ParkStatus.PARKED and p.method == "checkpoint" and p.host_bytes == 10 * GiB, p.to_json()
    assert used(units_host.root, 2) == 0 and all(not f.listed for f in p.proof.processes)
    pid = record(host, "c").park.pids[0][0]
    assert host.backend.checkpoint_state(pid) is CheckpointState.CHECKPOINTED
    assert [e["signal"] for e in host.audit().entries if e["action"] == "park"] == ["checkpoint lock", "checkpoint"]
    r = host.resume("c")
    assert r.ok and r.answer["same"] and host.backend.checkpoint_state(pid) is CheckpointState.RUNNING
    assert used(units_host.root, 2) == 10 * GiB


def test_a_unit_without_a_port_is_proven_by_its_memory_alone(host, units_host):
    """A torch process holding memory (here ``sim hold``) has no answer to compare: its checkpoint and
    restore are proven by NVML and its own readiness check."""
    spec = UnitSpec("hold", command=[sys.executable, "-m", "gpuslate", "sim", "hold", "--memory", "6GiB"], gpus=[5],
                    ready_log='"ready": true')
    assert host.up(spec).ok and record(host, "hold").reference is None
    p = host.park("hold")
    assert p.status is ParkStatus.PARKED and p.method == "checkpoint" and used(units_host.root, 5) == 0, p.to_json()
    r = host.resume("hold")
    assert r.ok and r.answer["same"] is None and "without a port" in r.answer["detail"], r.to_json()
    assert used(units_host.root, 5) == 6 * GiB


# -- the guards --------------------------------------------------------------------------------


def test_several_cuda_processes_are_refused_the_checkpoint(host, units_host):
    assert host.up(plain("tp", gpus=(0, 1))).ok  # two ranks sharing memory by CUDA IPC
    p = host.park("tp", ParkOptions(method=ParkWay.CHECKPOINT))
    assert p.status is ParkStatus.REFUSED and "2 CUDA processes" in p.reason and "#27" in p.reason
    assert state(host, "tp") is UnitState.READY and record(host, "tp").park is None
    assert used(units_host.root, 0) == 10 * GiB


def test_eagle3_with_cuda_graphs_is_refused_level_2_and_auto_takes_level_1(host):
    cfg = json.dumps({"method": "eagle3", "model": "org/d", "num_speculative_tokens": 3})
    assert host.up(vllm("e", "--speculative-config", cfg)).ok
    p = host.park("e", ParkOptions(method=ParkWay.LEVEL2))
    assert p.status is ParkStatus.REFUSED and "vLLM #55013" in p.reason, p.to_json()
    p = host.park("e")
    assert p.status is ParkStatus.PARKED and p.method == "level1"
    assert host.resume("e").ok


def test_a_vllm_without_dev_mode_is_refused_and_auto_takes_the_checkpoint(host):
    spec = vllm("d")
    spec.env = {}
    assert host.up(spec).ok
    p = host.park("d", ParkOptions(method=ParkWay.LEVEL1))
    assert p.status is ParkStatus.REFUSED and "VLLM_SERVER_DEV_MODE=1" in p.reason
    p = host.park("d")  # one worker: the driver's checkpoint, and auto says what it passed over
    assert p.status is ParkStatus.PARKED and p.method == "checkpoint" and "VLLM_SERVER_DEV_MODE" in p.why
    assert host.resume("d").ok


def test_expandable_segments_free_nothing_so_auto_parks_by_the_checkpoint(host):
    assert host.up(vllm("x", env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})).ok
    p = host.park("x", ParkOptions(method=ParkWay.LEVEL1))
    assert p.status is ParkStatus.REFUSED and "PR #11743" in p.reason
    assert host.park("x").method == "checkpoint"


def test_host_memory_that_would_not_hold_the_weights_is_refused(units_host, tmp_path):
    small = SimHost.init(tmp_path / "small", gpus=1, memory=96 * GiB, host_memory=16 * GiB)
    with Host.open(str(small.root)) as h:
        try:
            assert h.up(vllm("m")).ok
            p = h.park("m", ParkOptions(method=ParkWay.LEVEL1))
            assert p.status is ParkStatus.REFUSED and "host memory" in p.reason and p.proof is None, p.to_json()
            assert h.park("m").method == "level2"  # auto: nothing moves into host memory at level 2
            assert h.resume("m").ok
        finally:
            h.down("m")


def test_resume_without_room_is_refused_and_stays_parked(host):
    assert host.up(vllm("a", memory="60GiB")).ok
    assert host.park("a").ok
    assert host.up(plain("b", memory="60GiB")).ok  # took the GPU the parked unit left (beside its residue)
    r = host.resume("a")
    assert r.status is ResumeStatus.NO_ROOM and "GPU 0" in r.reason and state(host, "a") is UnitState.PARKED
    assert host.down("b").ok
    assert host.resume("a").ok


# -- the engines' misbehaviours ----------------------------------------------------------------


@pytest.mark.parametrize("misbehaviour", ["leak-after-sleep", "frees-nothing"])
def test_memory_that_did_not_leave_is_a_failed_park_undone_with_its_figures(host, units_host, misbehaviour):
    assert host.up(vllm("l", simargs=("--misbehave", misbehaviour))).ok
    p = host.park("l", ParkOptions(timeout=0.5))
    assert p.status is ParkStatus.NOT_FREED and p.undone, p.to_json()
    pid = record(host, "l").members[1][0] if len(record(host, "l").members) > 1 else None
    assert any("still holds" in line and "on GPU 0" in line for line in p.proof.problems), p.proof.problems
    assert pid is None or any(f.pid == pid and not f.ok for f in p.proof.processes)
    assert state(host, "l") is UnitState.READY and used(units_host.root, 0) == 20 * GiB  # woken: it serves
    assert complete(host.ps().get("l").unit.spec)["choices"]


def test_a_release_that_answers_before_the_memory_is_free_is_waited_for(host):
    assert host.up(sglang("r", simargs=("--misbehave", "early-return"))).ok
    p = host.park("r")
    assert p.status is ParkStatus.PARKED and p.timings["prove_s"] > 0.5, p.to_json()  # NVML's word, not the answer's


def test_requests_still_running_after_the_drain_refuse_the_park(host):
    """A sleep with requests in flight faults (vLLM #28714, played by crash-in-flight): the park is
    refused and the server lives."""
    spec = vllm("f", simargs=("--misbehave", "crash-in-flight", "--base-step-ms", "50"))
    assert host.up(spec).ok
    t = threading.Thread(target=complete, args=(spec, 200))
    t.start()
    try:
        wait_for(lambda: running(spec) >= 1)
        p = host.park("f", ParkOptions(drain_timeout=0.2))
        assert p.status is ParkStatus.REFUSED and "#28714" in p.reason and p.drain["running"] >= 1, p.to_json()
        assert state(host, "f") is UnitState.READY and record(host, "f").park is None
    finally:
        t.join(60)


@pytest.mark.parametrize("make,misbehaviour", [(vllm, "wrong-weights"), (sglang, "empty-weights")])
def test_weights_that_came_back_wrong_fail_the_resume_loudly(host, make, misbehaviour):
    assert host.up(make("w", simargs=("--misbehave", misbehaviour))).ok
    assert host.park("w").ok
    r = host.resume("w")
    assert r.status is ResumeStatus.WRONG_ANSWER and not r.answer["same"] and "different answer" in r.reason
    ps = host.ps().get("w")
    assert ps.state is UnitState.BROKEN and "restart w" in ps.park["line"]
    assert host.restart("w").ok and state(host, "w") is UnitState.READY  # a cold start ends it


# -- swap --park -------------------------------------------------------------------------------


def test_swap_park_both_ways_keeps_both_resident(host, units_host):
    a, b = vllm("a"), sglang("b", "--enable-weights-cpu-backup")
    assert host.up(a).ok
    s = host.swap("a", b, SwapOptions(park=True))
    assert s.ok and s.parked.ok and s.up is not None and s.down is None and s.switch == "park+restart"
    s = host.swap("b", "a", SwapOptions(park=True))
    assert s.ok and s.switch == "park" and s.resumed.ok and s.up is None, s.to_json()
    assert state(host, "a") is UnitState.READY and state(host, "b") is UnitState.PARKED
    assert s.overhead_s is not None and s.overhead_s < s.total_s


def test_swap_park_falls_back_to_a_cold_stop_saying_why(host):
    assert host.up(vllm("a", simargs=("--misbehave", "leak-after-sleep"))).ok
    s = host.swap("a", vllm("b"), SwapOptions(park=True, park_timeout=1.0))
    assert s.ok and s.down is not None and s.down.ok and s.parked.status is ParkStatus.NOT_FREED, s.to_json()
    assert "a was not parked (not_freed" in s.fallback and s.switch == "restart"
    assert state(host, "a") is UnitState.STOPPED and state(host, "b") is UnitState.READY


def test_swap_park_without_fallback_leaves_old_serving(host):
    assert host.up(vllm("a", simargs=("--misbehave", "frees-nothing"))).ok
    s = host.swap("a", vllm("b"), SwapOptions(park=True, fallback=False, park_timeout=1.0))
    assert s.status is SwapStatus.PARK_FAILED and s.up is None, s.to_json()
    assert state(host, "a") is UnitState.READY and host.ps().get("b") is None


def test_swap_park_to_a_new_whose_weights_come_back_wrong_restarts_it_cold(host):
    assert host.up(vllm("b", simargs=("--misbehave", "wrong-weights"))).ok
    assert host.swap("b", vllm("a"), SwapOptions(park=True)).ok  # b parked, a started
    s = host.swap("a", "b", SwapOptions(park=True))
    assert s.ok and s.resumed.status is ResumeStatus.WRONG_ANSWER and s.up is not None and s.up.ok, s.to_json()
    assert "b was not resumed (wrong_answer" in s.fallback and state(host, "b") is UnitState.READY


# -- kill -9 at every phase --------------------------------------------------------------------


def _kill_at(cmd: list[str], rec_path: Path, phase: str, cwd: Path) -> None:
    """Run ``gpuslate CMD`` and SIGKILL it once the unit's record says ``phase``."""
    proc = popen_units(*cmd, cwd=str(cwd))
    try:
        wait_for(lambda: f'"phase": "{phase}"' in rec_path.read_text(), timeout=30)
        proc.kill()
    finally:
        proc.wait(30)
        for f in (proc.stdout, proc.stderr):
            if f is not None:
                f.close()


@pytest.mark.parametrize("verb,phase", [("park", "draining"), ("park", "parking"), ("resume", "resuming")])
def test_a_gpuslate_killed_at_each_phase_leaves_a_named_state_that_resume_ends(host, units_host, tmp_path, verb,
                                                                                phase):
    slow = {"sleep": 3.0} if phase == "parking" else {"wake": 3.0} if phase == "resuming" else {}
    spec = vllm("k", simargs=("--base-step-ms", "20"), **slow)
    assert host.up(spec).ok
    path = store.UnitStore.of(host).record_path("k")
    t = None
    if verb == "resume":
        assert host.park("k").ok
    elif phase == "draining":  # a long request keeps the drain waiting
        t = threading.Thread(target=complete, args=(spec, 150))
        t.start()
        wait_for(lambda: running(spec) >= 1)
    _kill_at([verb, "k", *(["--drain-timeout", "60"] if verb == "park" else [])], path, phase, tmp_path)
    ps = host.ps().get("k")
    assert ps.state is UnitState.INTERRUPTED and "cut short" in ps.park["line"] and "resume k" in ps.park["line"]
    r = host.resume("k")
    assert r.ok, r.to_json()
    assert state(host, "k") is UnitState.READY and used(units_host.root, 0) == 20 * GiB
    assert complete(spec)["choices"]
    if t is not None:
        t.join(60)


@pytest.mark.parametrize("driver_state", ["locked", "checkpointed"])
def test_a_checkpoint_cut_short_is_ended_by_the_drivers_state(host, units_host, driver_state):
    """What a gpuslate killed between the driver's calls leaves (the record says parking, the driver
    has the process locked or checkpointed): ps names it; resume restores and unlocks by the state
    the driver reports."""
    assert host.up(plain("c", gpus=(3,))).ok
    rec = record(host, "c")
    worker = next(p.pid for r in host.backend.read([3], full=False) for p in r.processes)
    ticks = next(st.start_ticks for st in host.ps().get("c").unit.members() if st.pid == worker)
    host.backend.checkpoint_lock(worker)
    if driver_state == "checkpointed":
        host.backend.checkpoint(worker)
    rec.park = store.ParkRecord(method="checkpoint", phase=ParkPhase.PARKING, since=time.time(), by=[1, 0],
                                pids=[[worker, ticks]], held=[[worker, 3, 10 * GiB]], residue=[[worker, 3, 0]])
    store.UnitStore.of(host).save(rec)
    assert state(host, "c") is UnitState.INTERRUPTED
    r = host.resume("c")
    assert r.ok and host.backend.checkpoint_state(worker) is CheckpointState.RUNNING, r.to_json()
    assert used(units_host.root, 3) == 10 * GiB


def test_down_ends_a_parked_unit_and_a_broken_one(host, units_host):
    assert host.up(plain("c", gpus=(4,))).ok and host.park("c").ok
    assert host.down("c").ok and record(host, "c").park is None and used(units_host.root, 4) == 0


# -- the command line --------------------------------------------------------------------------


def test_the_commands_documents_match_their_schemas_and_exit_codes(units_host, tmp_path):
    spec = vllm("j", gpus=(0, 1))
    up = run_units("up", "j", "--gpus", "0,1", "--port", str(spec.port), "--engine", "vllm", "--env",
                   "VLLM_SERVER_DEV_MODE=1", "--", *spec.command, cwd=str(tmp_path))
    assert up.returncode == 0, up.stderr
    refused = run_units("park", "j", "--method", "checkpoint", "--json", cwd=str(tmp_path))
    assert refused.returncode == 4 and json.loads(refused.stdout)["status"] == "refused"
    parked = run_units("park", "j", "--json", cwd=str(tmp_path))
    assert parked.returncode == 0, parked.stderr
    resumed = run_units("resume", "j", "--json", cwd=str(tmp_path))
    assert resumed.returncode == 0, resumed.stderr
    for out, name in ((refused, "park"), (parked, "park"), (resumed, "resume")):
        schema = json.loads((SCHEMAS / f"{name}.v1.json").read_text())
        jsonschema.Draft202012Validator(schema).validate(json.loads(out.stdout))
    text = run_units("park", "j", cwd=str(tmp_path))
    assert text.returncode == 0 and "Unit j parked by level1" in text.stdout
    ps = run_units("ps", cwd=str(tmp_path))
    assert "parked" in ps.stdout and "unit j: parked by level1" in ps.stdout
    for view in ((), ("--compact",)):  # status says where the memory went, in both views
        status = run_units("status", *view, cwd=str(tmp_path))
        assert "Parked: unit j (pid" in status.stdout and "by level1) on GPU 0,1" in status.stdout, status.stdout
    doc = json.loads(run_units("status", "--json", cwd=str(tmp_path)).stdout)
    assert [u["unit"] for u in doc["parked"]] == ["j"] and doc["parked"][0]["host_bytes"] > 0
    jsonschema.Draft202012Validator(json.loads((SCHEMAS / "status.v1.json").read_text())).validate(doc)
    assert run_units("down", "j", cwd=str(tmp_path)).returncode == 0
    assert run_units("resume", "nosuch", cwd=str(tmp_path)).returncode == 2

