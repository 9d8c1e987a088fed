"""The job a Slurm hook runs for, read from the environment Slurm sets.

Slurm runs ``Prolog``/``Epilog`` as root with a small environment of its own
(no ``PATH``): ``SLURM_JOB_ID``, ``SLURM_JOB_UID``, ``SLURMD_NODENAME``,
``SLURM_CONF`` and, for a job with GPUs, ``SLURM_JOB_GPUS`` (the GRES indexes,
the order of ``gres.conf``'s ``File=`` lines). A hand-run hook or an older
Slurm may carry only ``SLURM_STEP_GPUS``, ``CUDA_VISIBLE_DEVICES`` or
``GPU_DEVICE_ORDINAL``: they are read in that order. Pure: a mapping in, a
:class:`SlurmJob` out, :class:`UsageError` (one line) for anything malformed.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import Any, NamedTuple

from .._document import MAX_ID, Fields
from .._parse import parse_gpu_list
from ..errors import UsageError

#: where the job's GPUs are read from, first found wins
GPU_VARIABLES = ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL")
_MAX_JOB_ID = 2**32


class SlurmJob(NamedTuple):
    job_id: int
    uid: int
    gpus: tuple[int, ...]  # the job's GPUs on this node, as gpuslate indexes them
    gpus_from: str | None  # the variable they were read from; None: the job had no GPUs here
    node: str  # this node's Slurm name (SLURMD_NODENAME), for scontrol

    def to_json(self) -> dict[str, Any]:
        return {"id": self.job_id, "uid": self.uid, "gpus": list(self.gpus), "gpus_from": self.gpus_from,
                "node": self.node}

    @classmethod
    def from_json(cls, d: object) -> SlurmJob:
        """Read inside :func:`gpuslate._document.reading`; every field checked."""
        f = Fields(d)
        return cls(f.integer("id", 0, _MAX_JOB_ID - 1, what="a job id"), f.integer("uid", 0, MAX_ID, what="a uid"),
                   tuple(f.gpus("gpus")), f.opt_text("gpus_from"), f.text("node"))


def _number(env: Mapping[str, str], name: str, high: int) -> int:
    text = env.get(name)
    if text is None or text == "":
        raise UsageError(f"{name} is not set: 'gpuslate slurm prolog/epilog' run as Slurm's Prolog/Epilog, "
                         "which sets it (to run one by hand, set SLURM_JOB_ID, SLURM_JOB_UID and SLURM_JOB_GPUS)")
    if not (text.isascii() and text.isdigit()) or int(text) >= high:
        raise UsageError(f"invalid {name} {text[:40]!r}: expected a number below {high}")
    return int(text)


def job_from_env(env: Mapping[str, str]) -> SlurmJob:
    """The job of a hook's environment (see the module doc)."""
    job_id = _number(env, "SLURM_JOB_ID", _MAX_JOB_ID)
    uid = _number(env, "SLURM_JOB_UID", 2**32 - 1)
    gpus: tuple[int, ...] = ()
    source = None
    for name in GPU_VARIABLES:
        text = env.get(name)
        if text is None or text.strip() in ("", "NoDevFiles"):
            continue
        try:
            gpus = tuple(sorted(set(parse_gpu_list(text.strip()))))
        except UsageError as exc:
            raise UsageError(f"cannot read the job's GPUs from {name}={text[:40]!r}: {exc}") from None
        source = name
        break
    node = env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    return SlurmJob(job_id, uid, gpus, source, node)
