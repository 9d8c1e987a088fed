"""``gpuslate slurm epilog`` and ``gpuslate slurm prolog``: Slurm's node hooks.

Slurm runs them as root with the job in the environment (see
:mod:`gpuslate.slurm.job`); the exit status is what Slurm acts on: non-zero
from a Prolog requeues the job and drains the node, from an Epilog drains the
node. gpuslate drains first, with a reason naming what holds the GPUs, so
``sinfo -R`` says what to look at. See docs/slurm.md.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..exits import ExitStatus, exit_epilog
from ..render.plain import clean
from . import present
from .common import add_common, describe, duration, size, with_examples

_EXITS = {0: "the job's GPUs are free", 2: "bad environment (no SLURM_JOB_ID, a GPU that does not exist): "
          "nothing was signaled", 4: "the GPUs were not free in time: the node was drained with the reason "
          "(or, with --no-drain, not)", 5: "not root for another user's job, or an unsafe state folder",
          8: "the GPUs were not free in time and the node could not be drained (scontrol missing or failing)"}


def build(p: argparse.ArgumentParser) -> None:
    """Its options (the parser is made from its row of the command table, with its summary)."""
    describe(p, examples=[("slurm.conf: Epilog=/usr/local/sbin/gpuslate-epilog, a script that runs",
                          "gpuslate slurm epilog --timeout 30s"),
                         ("and Prolog=...", "gpuslate slurm prolog --timeout 10s")],
             description="Run as Slurm's Epilog and Prolog (see docs/slurm.md). The job comes from "
                       "SLURM_JOB_ID, SLURM_JOB_UID and SLURM_JOB_GPUS (else SLURM_STEP_GPUS, "
                       "CUDA_VISIBLE_DEVICES, GPU_DEVICE_ORDINAL); the node from SLURMD_NODENAME.",
                       epilog=exit_epilog(_EXITS))
    hooks = p.add_subparsers(dest="slurm_command", metavar="HOOK", required=True)
    ep = hooks.add_parser("epilog", help="end what the ended job left on this node (its uid and SLURM_JOB_ID, "
                          "or its cgroup; nothing else), verify its GPUs free, else drain",
                          epilog=exit_epilog(_EXITS))
    ep.add_argument("--grace", type=duration, default=5.0, metavar="DURATION",
                    help="time between SIGTERM and SIGKILL (default 5s)")
    ep.add_argument("--timeout", type=duration, default=30.0, metavar="DURATION",
                    help="everything within this long, else drain (default 30s)")
    ep.epilog = with_examples([
        ("as slurmd runs it after a job (root, the job's variables set)",
         "gpuslate slurm epilog --timeout 30s --grace 5s"),
        ('report and exit 4, but leave the node as it is', 'gpuslate slurm epilog --no-drain')], ep.epilog)
    pr = hooks.add_parser("prolog", help="verify the job's GPUs free (signals nothing), else drain so that "
                          "Slurm requeues the job", epilog=exit_epilog(_EXITS))
    pr.add_argument("--timeout", type=duration, default=10.0, metavar="DURATION",
                    help="wait at most this long for the GPUs to be free, else drain (default 10s)")
    pr.epilog = with_examples([
        ('as slurmd runs it before a job', 'gpuslate slurm prolog --timeout 10s')], pr.epilog)
    tp = hooks.add_parser("task-prolog", help="as Slurm's TaskProlog: print 'export SPT_NOENV=1', so that a task's "
                          "workers renamed with setproctitle keep SLURM_JOB_ID in /proc/PID/environ",
                          description="Run as Slurm's TaskProlog (see docs/slurm.md): prints the environment every "
                          "task gets, in Slurm's protocol ('export NAME=value' lines). Reads nothing, signals "
                          "nothing.", epilog=exit_epilog({0: "printed"}))
    tp.epilog = with_examples([
        ('slurm.conf: TaskProlog= a script that runs', 'gpuslate slurm task-prolog')], tp.epilog)
    tp.set_defaults(handler=run_task_prolog)
    for h in (ep, pr):
        add_common(h)
        h.add_argument("--max-used", type=size, metavar="SIZE",
                       help="most memory a free GPU may show (default: what an idle GPU shows on this driver)")
        h.add_argument("--no-drain", action="store_true",
                       help="report and exit 4, but do not drain (Slurm then drains with its own reason)")
        h.set_defaults(handler=run_hook)
    add_common(p)


def run_task_prolog(args: argparse.Namespace) -> int:
    from ...slurm.task import task_prolog_lines  # lazy: startup

    sys.stdout.write("".join(line + "\n" for line in task_prolog_lines()))
    return ExitStatus.OK


def run_hook(args: argparse.Namespace) -> int:
    from ...api import Host  # lazy: startup
    from ...slurm.hooks import HookStatus, epilog, prolog  # lazy: startup
    from ...slurm.job import job_from_env  # lazy: startup

    job = job_from_env(os.environ)  # a bad environment: UsageError before anything is opened
    with Host.open(getattr(args, "sim", None)) as host:
        host.backend  # noqa: B018 - opened first, as before the Host: no driver is exit 3, whoever runs it
        if args.slurm_command == "epilog":
            result = epilog(host, job, grace=args.grace, timeout=args.timeout, max_used=args.max_used,
                            drain=not args.no_drain)
        else:
            result = prolog(host, job, timeout=args.timeout, max_used=args.max_used, drain=not args.no_drain)
    shown = present(args, result)
    if result.status == HookStatus.DRAIN_FAILED and result.drain is not None:
        sys.stderr.write(f"gpuslate: error: node {clean(result.drain.node)} not drained: "
                         f"{clean(result.drain.error)}\n")
    return shown
