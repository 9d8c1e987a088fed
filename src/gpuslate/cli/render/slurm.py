"""The output of ``slurm prolog`` and ``slurm epilog``, here or from another host's document."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._parse import gpus_phrase
from .plain import clean

if TYPE_CHECKING:
    from ...slurm.hooks import HookResult


def show_hook(result: HookResult) -> None:
    """A Slurm hook's result, here or from another host's document (see :mod:`.results`)."""
    from ...slurm.hooks import HookStatus  # lazy: startup

    job = result.job
    head = f"slurm {result.hook.value}: job {job.job_id} on {clean(job.node)}"
    gpus = gpus_phrase(list(job.gpus)) if job.gpus else "no GPUs allocated here"
    if result.clear is not None:
        n = len(result.clear.results)
        print(f"{head}: ended {n} process{'es' if n != 1 else ''} of the job "
              f"({result.clear.status.value}, {len(result.found)} found)")
    if result.refused:
        print(f"{head}: the job's processes were not ended: {clean(result.refused)}")
    for u in result.unproven:
        print(f"{head}: pid {u.pid} holds the job's GPUs but is not shown to be the job's: {clean(u.reason)}; "
              "left alone")
    if result.status == HookStatus.CLEAN:
        print(f"{head}: {gpus} free after {result.timings.get('total_s', 0.0):.3f} s")
        return
    from .clear import print_diagnosis  # lazy: startup

    print(f"{head}: {gpus} not free after {result.timings.get('total_s', 0.0):.1f} s:")
    print_diagnosis(result.diagnosis)
    if result.drain is not None and result.drain.ok:
        already = " already" if result.drain.already else ""
        print(f"node {clean(result.drain.node)}{already} drained: {clean(result.drain.reason)}")
