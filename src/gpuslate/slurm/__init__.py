"""Slurm: gpuslate as a node's ``Prolog`` and ``Epilog``.

* :mod:`.job` reads the job a hook runs for from the environment Slurm gives it
  (``SLURM_JOB_ID``, ``SLURM_JOB_UID``, ``SLURM_JOB_GPUS``...).
* :mod:`.find` is the job-finding rule: which processes on this node belong to
  that job (its uid and its ``SLURM_JOB_ID`` in ``/proc/PID/environ``, or its
  cgroup), as a pure decision on gathered facts.
* :mod:`.drain` words a drain reason an administrator can act on and asks
  ``scontrol`` to drain the node.
* :mod:`.hooks` is the epilog (end exactly the ended job's leftovers through
  ``clear``'s plan/act/verify, then verify its GPUs free or drain) and the
  prolog (verify the allocated GPUs free or drain; signals nothing).

Running commands across an allocation is a transport of the fleet runner:
:mod:`gpuslate.remote.srun`. See docs/slurm.md. The library never prints.
"""
