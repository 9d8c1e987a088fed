"""The driver's checkpoint API on a simulated host: lock, checkpoint, restore, unlock a process.

What the real driver does (driver R570 and later, ``cuCheckpointProcess*``; NVIDIA's
``cuda-checkpoint`` README and the CUDA driver API reference, cited in docs/units.md,
"Park and resume"), and so what this does:

* **States and calls** (:func:`rule`, pure): ``lock`` needs RUNNING and leaves LOCKED (the
  process's further CUDA calls block: :meth:`SimHost.wait_running`); ``checkpoint`` needs LOCKED
  and leaves CHECKPOINTED: its device memory is copied into host memory and its GPU allocations
  released, so the driver lists it on no GPU and the memory counts in the host's; ``restore`` needs
  CHECKPOINTED and leaves LOCKED, the memory back on the same GPUs (room permitting); ``unlock``
  needs LOCKED and leaves RUNNING. Anything else: ``CUDA_ERROR_ILLEGAL_STATE``, nothing changed.
* **No CUDA IPC memory** (nor UVM): a process holding memory shared with other processes (the
  ranks of a tensor-parallel server, ``sim hold --ipc``, ``sim serve`` with several workers) is
  refused at ``checkpoint`` with ``CUDA_ERROR_NOT_SUPPORTED`` and left FAILED: "does not attempt to
  keep the process in a good state if an error ... is encountered during checkpoint" (README).
  A FAILED process can no longer use CUDA; only its end frees what it holds.
* **A thread id is its process**: given the id of a thread, the driver acts on the thread's
  process (cuda-checkpoint #41, where a toggle of a thread id checkpointed its process). So does
  this: callers must pass only process ids they have checked.
* **Who may**: the process's own user, or root (``CUDA_ERROR_NOT_PERMITTED`` otherwise).
* **No CUDA process** (the pid holds no device of this host): ``CUDA_ERROR_INVALID_VALUE``.

* **Device files stay open**: a simulated process keeps its descriptors on the device files while
  checkpointed, so ``status`` lists it as a ``handle`` holder with no memory. Real processes differ:
  one that only used CUDA holds no ``/dev/nvidia*`` descriptor or mapping once checkpointed (``lsof``
  in cuda-checkpoint #28 shows only ``libnvidia-ml.so``; a checkpointed ``transformers serve`` on an
  H100, 2026-12-05, was on no list of ``status`` at all: benchmarks/RESULTS.md, issue 37), while a
  vLLM server keeps some (#31: those NVML and other libraries opened, which the driver's checkpoint
  does not own). The simulation plays the second, not yet the first; the park proof asks only NVML's
  list and memory, so it holds for both.

Not modelled, said so: a lock's wait for submitted work (a simulated holder has none: the lock
is immediate, and ``timeout_ms`` never runs out); restoring onto other GPUs (``gpu_mapping``);
the hang of NCCL peers while one rank is locked (cuda-checkpoint #30). Where the driver's
behaviour is unknown the choice is written down: a restore without room fails with
``CUDA_ERROR_OUT_OF_MEMORY`` and leaves the process CHECKPOINTED; a checkpoint without host
memory for it fails so and leaves it LOCKED.

The state lives in ``DIR/ckpt/PID.json`` (:class:`~gpuslate.gpu.simhost.host.CkptEntry`), kept
for as long as its process lives: the driver's state dies with the process.
"""

from __future__ import annotations

import os
from enum import Enum
from typing import NamedTuple

from ..._parse import format_gpu_list, format_size
from ...errors import CheckpointError, ServerFailed
from ...proc.fdscan import read_fd_targets
from ...proc.procfs import PROC, read_stat
from ..types import CheckpointState
from .host import CkptEntry, SimHost


class Op(Enum):
    """A call of the checkpoint API that changes a process's state."""

    LOCK = "lock"
    CHECKPOINT = "checkpoint"
    RESTORE = "restore"
    UNLOCK = "unlock"


class Refusal(NamedTuple):
    """A call the driver refuses: its error name, and why in words."""

    code: str
    why: str


#: the state each call needs, and the state it leaves
_RULES: dict[Op, tuple[CheckpointState, CheckpointState]] = {
    Op.LOCK: (CheckpointState.RUNNING, CheckpointState.LOCKED),
    Op.CHECKPOINT: (CheckpointState.LOCKED, CheckpointState.CHECKPOINTED),
    Op.RESTORE: (CheckpointState.CHECKPOINTED, CheckpointState.LOCKED),
    Op.UNLOCK: (CheckpointState.LOCKED, CheckpointState.RUNNING),
}


def rule(state: CheckpointState, op: Op) -> CheckpointState | Refusal:
    """The driver's state rule for ``op`` on a process in ``state``: the state it leaves, or the
    refusal (nothing changed). The one table of them; every backend follows it."""
    needs, leaves = _RULES[op]
    if state is needs:
        return leaves
    return Refusal("CUDA_ERROR_ILLEGAL_STATE",
                   f"{op.value} needs a process in the {needs.value} state; this one is {state.value}")


class SimCheckpoint:
    """The simulated driver's checkpoint API on one host (the module docstring says what it does)."""

    def __init__(self, host: SimHost) -> None:
        self.host = host

    # -- the calls ---------------------------------------------------------------
    def state(self, pid: int) -> CheckpointState:
        pid = self._process(pid)
        entry = self.host.checkpoint_entries().get(pid)
        return CheckpointState(entry.state) if entry is not None else CheckpointState.RUNNING

    def lock(self, pid: int, timeout_ms: int = 0) -> None:
        if timeout_ms < 0:
            raise CheckpointError(f"lock of pid {pid}: timeout_ms must be >= 0", driver_code="CUDA_ERROR_INVALID_VALUE",
                                  pid=pid)
        pid = self._process(pid)
        self._step(pid, Op.LOCK)
        st = read_stat(pid)
        self.host.write_checkpoint_entry(CkptEntry(pid, st.start_ticks if st else 0, "locked", (), 0, os.geteuid()),
                                         pid)

    def checkpoint(self, pid: int) -> None:
        pid = self._process(pid)
        entry = self._step(pid, Op.CHECKPOINT)
        held = [h.record for h in self.host.survey().held if h.alive and h.record.pid == pid]
        shared = sorted({r.gpu for r in held if r.ipc})
        if shared:
            self.host.write_checkpoint_entry(entry._replace(state="failed"), pid)
            raise CheckpointError(
                f"checkpoint of pid {pid}: it holds CUDA IPC memory (shared with other processes) on GPU "
                f"{format_gpu_list(shared)}, which the driver's checkpoint does not support; the process is left "
                "failed (CU_PROCESS_STATE_FAILED) and can no longer use CUDA", driver_code="CUDA_ERROR_NOT_SUPPORTED",
                pid=pid)
        nbytes = sum(r.bytes for r in held)
        _, available = self.host.host_memory()
        if nbytes > available:
            raise CheckpointError(f"checkpoint of pid {pid}: {format_size(nbytes)} of GPU memory do not fit in the "
                                  f"host's {format_size(available)} available; the process stays locked",
                                  driver_code="CUDA_ERROR_OUT_OF_MEMORY", pid=pid)
        self.host.write_checkpoint_entry(entry._replace(state="checkpointed", records=tuple(r.path.name for r in held),
                                                        bytes=nbytes), pid)

    def restore(self, pid: int) -> None:
        pid = self._process(pid)
        entry = self._step(pid, Op.RESTORE)
        try:
            self.host.restore_records(entry)
        except ServerFailed as exc:  # no room on a GPU it held: the memory stays in host memory
            raise CheckpointError(f"restore of pid {pid}: {exc}; the process stays checkpointed",
                                  driver_code="CUDA_ERROR_OUT_OF_MEMORY", pid=pid) from None

    def unlock(self, pid: int) -> None:
        pid = self._process(pid)
        self._step(pid, Op.UNLOCK)
        self.host.write_checkpoint_entry(None, pid)

    # -- the driver's checks -----------------------------------------------------
    def _step(self, pid: int, op: Op) -> CkptEntry:
        """The entry of ``pid`` if ``op`` is allowed in its state (a fresh one for a running process),
        else the driver's refusal."""
        entry = self.host.checkpoint_entries().get(pid)
        state = CheckpointState(entry.state) if entry is not None else CheckpointState.RUNNING
        got = rule(state, op)
        if isinstance(got, Refusal):
            raise CheckpointError(f"{op.value} of pid {pid}: {got.why}", driver_code=got.code, pid=pid)
        if entry is None:
            st = read_stat(pid)
            entry = CkptEntry(pid, st.start_ticks if st else 0, "locked", (), 0, os.geteuid())
        return entry

    def _process(self, pid: int) -> int:
        """The process the driver acts on for ``pid`` (a thread's id is its process's), checked to
        be a CUDA process of this host that this user may act on."""
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            raise CheckpointError(f"pid {pid!r} is not a process id", driver_code="CUDA_ERROR_INVALID_VALUE", pid=0)
        tgid = _tgid(pid)
        if tgid is None:
            raise CheckpointError(f"pid {pid}: no such process", driver_code="CUDA_ERROR_INVALID_VALUE", pid=pid)
        try:
            uid = os.stat(f"{PROC}/{tgid}").st_uid
        except OSError:
            raise CheckpointError(f"pid {pid}: no such process", driver_code="CUDA_ERROR_INVALID_VALUE",
                                  pid=pid) from None
        if os.geteuid() not in (0, uid):
            raise CheckpointError(f"pid {tgid} is another user's process (uid {uid}): the driver lets only its user "
                                  "or root checkpoint it", driver_code="CUDA_ERROR_NOT_PERMITTED", pid=pid)
        targets = read_fd_targets(tgid, threads=True)
        prefix = f"{self.host.real_dev}/nvidia"
        if targets is None or not any(t.startswith(prefix) for t in targets):
            raise CheckpointError(f"pid {tgid} is not a CUDA process of this host (it holds no GPU device)",
                                  driver_code="CUDA_ERROR_INVALID_VALUE", pid=pid)
        return tgid


def _tgid(pid: int) -> int | None:
    """The process (thread group) of the task ``pid``: itself, or the process a thread id belongs to."""
    try:
        with open(f"{PROC}/{pid}/status", "rb") as f:
            for line in f.read(1 << 14).splitlines():
                if line.startswith(b"Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None
