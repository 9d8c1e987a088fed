"""Draining a node: the reason an administrator reads, and ``scontrol`` to set it.

The reason names each GPU that is not free, how much it holds, the job, and
what holds it (``gpuslate: GPU 1 holds 3.0 GiB after job 42 (no process holds
it)``), so ``sinfo -R`` says what to look at. It is one printable line of at
most :data:`MAX_REASON` characters: text from processes (names, users) has its
control characters replaced, and it reaches ``scontrol`` as one argv word,
never through a shell.

``scontrol`` is run through :mod:`.scontrol`. A missing or failing
``scontrol`` is a :class:`DrainOutcome` with the error, not an exception: the
hook then exits with its own code and Slurm drains the node itself
("Prolog error"/"Epilog error").
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from .._document import Fields
from .._parse import format_size
from ..clearing.wait import GpuDiagnosis
from . import scontrol
from .scontrol import printable

MAX_REASON = 250
#: the least time a drain is given (its two scontrol calls together), even when the hook's time is spent:
#: draining is what keeps the next job off GPUs that are not free
DRAIN_MIN_S = 5.0


class DrainOutcome(NamedTuple):
    node: str
    reason: str  # the node's reason now: gpuslate's, or the one it already had
    ok: bool  # the node is drained (or draining)
    error: str | None
    already: bool = False  # it was drained before: its reason (an administrator's, a prolog's) is kept

    def to_json(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_json(cls, d: object) -> DrainOutcome:
        f = Fields(d)
        return cls(f.text("node"), f.text("reason"), f.flag("ok"), f.opt_text("error"), f.flag("already"))


def _who(d: GpuDiagnosis) -> str:
    parts: list[str] = []
    for p in d.problems:
        if p.pid is None:
            parts.append("no process holds it" if p.used_memory is not None else p.reason.split(":")[0])
        else:
            name = (p.command or "").split(" ")[0].rsplit("/", 1)[-1] or "?"
            parts.append(f"pid {p.pid} {name}" + (f" of {p.user}" if p.user else ""))
    return ", ".join(dict.fromkeys(parts)) or "state unknown"


def drain_reason(when: str, job_id: int, diagnosis: Sequence[GpuDiagnosis]) -> str:
    """``gpuslate: GPU 1 holds 3.0 GiB after job 42 (no process holds it); GPU 2 ...``
    (``when``: ``after`` for an epilog, ``before`` for a prolog)."""
    parts = []
    for i, d in enumerate(diagnosis):
        held = f"holds {format_size(d.used)}" if d.used is not None else "is in an unknown state"
        job = f" {when} job {job_id}" if i == 0 else ""
        parts.append(f"GPU {d.gpu} {held}{job} ({_who(d)})")
    text = printable("gpuslate: " + ("; ".join(parts) or f"GPUs not free {when} job {job_id}"))
    return text if len(text) <= MAX_REASON else text[:MAX_REASON - 3] + "..."


def drained_reason(show_node: str) -> str | None:
    """The reason of a node ``scontrol -o show node`` shows drained (or draining), else None (pure)."""
    state = next((w[len("State="):] for w in show_node.split() if w.startswith("State=")), "")
    if "DRAIN" not in state.upper():
        return None
    reason = show_node.split(" Reason=", 1)[1] if " Reason=" in show_node else ""
    return printable(reason.strip()) or "(no reason)"


def drain_node(node: str, reason: str, *, timeout: float = scontrol.TIMEOUT_S) -> DrainOutcome:
    """``scontrol update nodename=NODE state=drain reason=REASON``, unless the node is drained
    already: then its reason stays (an administrator's, or the prolog's before Slurm runs the
    epilog of the job it refused)."""
    if scontrol.find() is None:
        return DrainOutcome(node, reason, False, scontrol.not_found())
    deadline = time.monotonic() + timeout  # both calls within ``timeout``, each from its start to its exit
    shown, error = scontrol.run(["-o", "show", "node", node], timeout=timeout)
    before = drained_reason(shown) if error is None else None
    if before is not None:
        return DrainOutcome(node, before, True, None, already=True)
    _, error = scontrol.run(["update", f"nodename={node}", "state=drain", f"reason={reason}"],
                            timeout=max(DRAIN_MIN_S / 2, deadline - time.monotonic()))
    return DrainOutcome(node, reason, error is None, error)
