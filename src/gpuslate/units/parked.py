"""The parked units of a state folder, for ``status``: which units hold host memory while their
GPU memory is released (units/park.py), read from their records without loading the unit machinery.

Light on purpose (``status`` calls it at every start where a state folder has units): the records
and ``/proc`` only, no GPU reading (the snapshot has them) and no import of the verbs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..proc.procfs import read_stat
from .state import ParkPhase
from .store import UnitRecord, UnitStore


def parked_units(state: Path) -> list[dict[str, Any]]:
    """Every unit of the state folder ``state`` whose record says parked and whose main process
    still lives (with its recorded start time): ``{unit, method, pid, pids, gpus, host_bytes,
    residue, since}`` (``residue``: what its processes may keep on their GPUs, in all)."""
    units = UnitStore(state)
    out: list[dict[str, Any]] = []
    for name in units.names():
        rec = units.read(name)
        if not isinstance(rec, UnitRecord) or rec.park is None or rec.park.phase is not ParkPhase.PARKED:
            continue
        st = read_stat(rec.pid)
        if st is None or st.start_ticks != rec.start_ticks or st.has_exited:
            continue
        pr = rec.park
        out.append({"unit": name, "method": pr.method, "pid": rec.pid, "pids": [p for p, _ in pr.pids],
                    "gpus": sorted({g for _, g, _ in pr.held}), "host_bytes": pr.host_bytes,
                    "residue": sum(b for _, _, b in pr.residue), "since": pr.since})
    return out
