"""``TaskProlog``: what every task of a job gets in its environment from gpuslate.

Slurm runs ``TaskProlog`` (slurm.conf) as the job's user before each task
(the batch script's too) and reads its standard output: a line ``export
NAME=value`` sets ``NAME`` in the task's environment (everything after the
``=`` to the end of the line is the value), ``unset NAME`` removes it,
``print ...`` goes to the task's output. gpuslate exports
:data:`gpuslate.proc.environ.KEEP_ENVIRONMENT` (``SPT_NOENV=1``): a worker the
task starts that renames itself with py-setproctitle (SGLang's schedulers,
vLLM's engine core) keeps ``SLURM_JOB_ID`` readable in ``/proc/PID/environ``,
so that the epilog finds it by its environment. Pure.
"""

from __future__ import annotations

from ..proc.environ import KEEP_ENVIRONMENT


def task_prolog_lines() -> list[str]:
    """The lines ``gpuslate slurm task-prolog`` prints, in Slurm's TaskProlog protocol."""
    return [f"export {name}={value}" for name, value in KEEP_ENVIRONMENT.items()]
