"""The simulated driver's checkpoint API plays the real one's rules on real holder processes.

Every holder is a real ``gpuslate sim hold`` process the test starts (and kills, also on failure:
the ``hold`` fixture); the backend is the one every command uses, so ``status`` sees what a
checkpoint moves. The state rule itself is a pure table with a model test.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslate.errors import CheckpointError
from gpuslate.gpu.simhost import SimBackend
from gpuslate.gpu.simhost.checkpoint import Op, Refusal, rule
from gpuslate.gpu.simhost.host import SimHost
from gpuslate.gpu.types import CheckpointState
from helpers import GiB, wait_for

S = CheckpointState


def used(be: SimBackend, gpu: int) -> int:
    (r,) = be.read([gpu], full=False)
    assert r.memory is not None
    return r.memory.used


def listed(be: SimBackend, gpu: int) -> set[int]:
    (r,) = be.read([gpu], full=False)
    return {p.pid for p in r.processes or []}


def refused(code: str, fn, *args) -> CheckpointError:
    with pytest.raises(CheckpointError) as info:
        fn(*args)
    assert info.value.driver_code == code, info.value
    return info.value


# -- the rule, pure ------------------------------------------------------------------
@given(st.lists(st.sampled_from(list(Op)), max_size=30), st.sampled_from(list(S)))
def test_rule_allows_only_the_drivers_four_transitions(ops: list[Op], start: CheckpointState) -> None:
    allowed = {(S.RUNNING, Op.LOCK): S.LOCKED, (S.LOCKED, Op.CHECKPOINT): S.CHECKPOINTED,
               (S.CHECKPOINTED, Op.RESTORE): S.LOCKED, (S.LOCKED, Op.UNLOCK): S.RUNNING}
    state = start
    for op in ops:
        got = rule(state, op)
        if (state, op) in allowed:
            assert got is allowed[(state, op)]
            state = got
        else:  # refused, and nothing changes: FAILED is never left, RUNNING never checkpointed
            assert isinstance(got, Refusal) and got.code == "CUDA_ERROR_ILLEGAL_STATE"
            assert state.value in got.why


# -- on real processes ----------------------------------------------------------------
def test_checkpoint_moves_the_memory_to_the_host_and_restore_brings_it_back(sim_host: SimHost, hold) -> None:
    be = SimBackend(sim_host.root)
    h = hold("--gpus", "0,1", "--memory", "20GiB")
    total, before = be.host_memory()
    assert be.checkpoint_state(h.pid) is S.RUNNING
    refused("CUDA_ERROR_ILLEGAL_STATE", be.checkpoint, h.pid)  # running: lock first
    refused("CUDA_ERROR_ILLEGAL_STATE", be.checkpoint_unlock, h.pid)

    be.checkpoint_lock(h.pid)
    assert be.checkpoint_state(h.pid) is S.LOCKED
    assert used(be, 0) == 20 * GiB and h.pid in listed(be, 0)  # locked: still on the GPU
    refused("CUDA_ERROR_ILLEGAL_STATE", be.checkpoint_lock, h.pid)

    be.checkpoint(h.pid)
    assert be.checkpoint_state(h.pid) is S.CHECKPOINTED
    for gpu in (0, 1):  # gone from every GPU's list, its memory free, now in the host's
        assert used(be, gpu) == 0 and h.pid not in listed(be, gpu)
    assert be.host_memory() == (total, before - 40 * GiB)
    refused("CUDA_ERROR_ILLEGAL_STATE", be.checkpoint_unlock, h.pid)  # checkpointed: restore first

    be.checkpoint_restore(h.pid)
    assert be.checkpoint_state(h.pid) is S.LOCKED
    for gpu in (0, 1):  # back on the same GPUs
        assert used(be, gpu) == 20 * GiB and h.pid in listed(be, gpu)
    assert be.host_memory() == (total, before)
    be.checkpoint_unlock(h.pid)
    assert be.checkpoint_state(h.pid) is S.RUNNING
    assert not list((sim_host.root / "ckpt").iterdir())  # running again: the driver keeps nothing


def test_ipc_memory_is_refused_and_the_process_left_failed(sim_host: SimHost, hold) -> None:
    be = SimBackend(sim_host.root)
    h = hold("--gpus", "0", "--memory", "4GiB", "--ipc")
    be.checkpoint_lock(h.pid)
    err = refused("CUDA_ERROR_NOT_SUPPORTED", be.checkpoint, h.pid)
    assert "IPC" in err.message
    assert be.checkpoint_state(h.pid) is S.FAILED
    assert used(be, 0) == 4 * GiB and h.pid in listed(be, 0)  # nothing moved
    for call in (be.checkpoint_unlock, be.checkpoint_restore, be.checkpoint_lock):
        refused("CUDA_ERROR_ILLEGAL_STATE", call, h.pid)  # failed is never left ...
    h.kill()
    wait_for(lambda: not list((sim_host.root / "ckpt").iterdir()) or not be.host.checkpoint_entries())
    wait_for(lambda: used(be, 0) == 0)  # ... but by the process's end


def test_a_thread_id_acts_on_its_process(sim_host: SimHost, hold) -> None:
    """cuda-checkpoint #41: the driver takes a thread's id for its process. Callers must pass checked pids."""
    be = SimBackend(sim_host.root)
    h = hold("--gpus", "0", "--memory", "2GiB", "--main-thread-exits")
    tid = int(wait_for(lambda: next((int(t) for t in os.listdir(f"/proc/{h.pid}/task") if int(t) != h.pid), None)))
    be.checkpoint_lock(tid)
    assert be.checkpoint_state(h.pid) is S.LOCKED
    be.checkpoint_unlock(h.pid)


def test_no_cuda_process_and_no_process_are_invalid(sim_host: SimHost) -> None:
    be = SimBackend(sim_host.root)
    refused("CUDA_ERROR_INVALID_VALUE", be.checkpoint_lock, os.getpid())  # holds no GPU of this host
    refused("CUDA_ERROR_INVALID_VALUE", be.checkpoint_state, 0)
    assert not (sim_host.root / "ckpt").exists() or not list((sim_host.root / "ckpt").iterdir())


def test_restore_without_room_leaves_it_checkpointed(sim_host: SimHost, hold) -> None:
    be = SimBackend(sim_host.root)
    a = hold("--gpus", "0", "--memory", "60GiB")
    be.checkpoint_lock(a.pid)
    be.checkpoint(a.pid)
    b = hold("--gpus", "0", "--memory", "50GiB")  # the room it left, taken meanwhile
    err = refused("CUDA_ERROR_OUT_OF_MEMORY", be.checkpoint_restore, a.pid)
    assert "GPU 0" in err.message
    assert be.checkpoint_state(a.pid) is S.CHECKPOINTED and used(be, 0) == 50 * GiB
    b.kill()
    wait_for(lambda: used(be, 0) == 0)
    be.checkpoint_restore(a.pid)
    be.checkpoint_unlock(a.pid)
    assert used(be, 0) == 60 * GiB


def test_checkpoint_needs_host_memory(tmp_path: Path, hold) -> None:
    small = SimHost.init(tmp_path / "small", gpus=2, memory=96 * GiB, host_memory=16 * GiB)
    be = SimBackend(small.root)
    h = hold("--gpus", "0", "--memory", "20GiB", host=small)
    be.checkpoint_lock(h.pid)
    refused("CUDA_ERROR_OUT_OF_MEMORY", be.checkpoint, h.pid)
    assert be.checkpoint_state(h.pid) is S.LOCKED and used(be, 0) == 20 * GiB
    be.checkpoint_unlock(h.pid)


def test_a_checkpointed_process_that_dies_frees_both(sim_host: SimHost, hold) -> None:
    be = SimBackend(sim_host.root)
    total, free = be.host_memory()
    h = hold("--gpus", "3", "--memory", "8GiB")
    be.checkpoint_lock(h.pid)
    be.checkpoint(h.pid)
    assert be.host_memory() == (total, free - 8 * GiB)
    h.kill()
    wait_for(lambda: be.host_memory() == (total, free))
    wait_for(lambda: used(be, 3) == 0)
