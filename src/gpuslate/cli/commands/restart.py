"""``gpuslate restart [NAME...]``: stop units and start them again as they last ran (``docker compose
restart``); none named: every unit of the unit file that has run. Its options: gpuslate/verbs.py's RESTART."""

from __future__ import annotations

import argparse

from ...api import Host
from ...units.batch import restart_many
from ...units.interrupts import stop_signals_interrupt
from ...units.resolving import file_units
from ...units.store import UnitStore
from ...verbs import RESTART
from . import present
from .common import note


def run(args: argparse.Namespace) -> int:
    line = RESTART.read(args)
    with stop_signals_interrupt(), Host.open(getattr(args, "sim", None), on_event=note) as host:
        if len(line.names) == 1:
            return present(args, host.restart(line.names[0], line.options))
        names = list(dict.fromkeys(line.names))
        if not names:
            units = UnitStore.of(host)
            names = [n for n in file_units(line.config, "restart") if units.record_path(n).exists()]
        return present(args, restart_many(host, names, line.options))
