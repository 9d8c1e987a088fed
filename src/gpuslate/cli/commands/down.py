"""``gpuslate down NAME``: stop every process of a unit and verify its GPU memory is released;
``gpuslate down [NAME...]``: several, or every unit of the unit file (as ``docker compose down``).
Its options: gpuslate/verbs.py's DOWN."""

from __future__ import annotations

import argparse
import signal

from ...api import Host
from ...units.batch import down_many
from ...units.interrupts import deferred_interrupts
from ...units.resolving import file_units
from ...verbs import DOWN
from ..render.live import LiveLine
from . import present


def run(args: argparse.Namespace) -> int:
    line = DOWN.read(args)
    names = list(dict.fromkeys(line.names)) or file_units(line.config, "down")
    # a dropped ssh session must not leave it half-stopped
    with deferred_interrupts(signals=(signal.SIGHUP,)), LiveLine.of(args) as live, \
            Host.open(getattr(args, "sim", None), on_event=live.note, on_progress=live.sink) as host:
        if len(line.names) == 1:
            return present(args, host.down(line.names[0], line.options))
        return present(args, down_many(host, names, line.options, known_only=not line.names))
