"""``gpuslate up NAME [options] -- COMMAND ARGS...``: start a managed server, return once it serves;
``gpuslate up [NAME...]``: several units of the unit file, or all of them (as ``docker compose up``).
Its options: gpuslate/verbs.py's UP."""

from __future__ import annotations

import argparse

from ...api import Host
from ...errors import UsageError
from ...options import UpLine
from ...units.batch import up_many
from ...units.interrupts import stop_signals_interrupt
from ...units.resolving import file_units, spec_for
from ...verbs import UP
from ..render.live import LiveLine
from . import present
from .common import confirm_plan


def run(args: argparse.Namespace) -> int:
    line = UP.read(args)
    if UP.needs_consent(line) and not args.yes:  # --clear on a terminal (cli/main.py refused it without one)
        line = line._replace(options=line.options._replace(confirm=confirm_plan))
    if len(line.names) != 1:
        return run_many(args, line)
    with LiveLine.of(args) as live, Host.open(getattr(args, "sim", None), on_event=live.note,
                                              on_progress=live.sink) as host:
        spec = spec_for(host, line.names[0], config=line.config, overrides=line.unit.overrides(),
                        command=list(line.command) or None)
        with stop_signals_interrupt():  # a SIGTERM or SIGHUP cleans up like Ctrl-C (exit 130)
            result = host.up(spec, line.options)
    return present(args, result)


def run_many(args: argparse.Namespace, line: UpLine) -> int:
    """``up A B ...`` or ``up``: the units of the unit file (or their last runs), one after another."""
    if line.command:
        raise UsageError("a command after '--' is one unit's: give it one NAME")
    given = sorted(line.unit.given())
    if given:
        raise UsageError(f"{', '.join(given)} define{'s' if len(given) == 1 else ''} one unit: with several "
                         "units (or none named), each takes its own from the unit file")
    names = list(dict.fromkeys(line.names)) or file_units(line.config, "up")
    with LiveLine.of(args) as live, Host.open(getattr(args, "sim", None), on_event=live.note,
                                              on_progress=live.sink) as host:
        specs = [spec_for(host, name, config=line.config) for name in names]  # all before anything starts
        with stop_signals_interrupt():
            result = up_many(host, specs, line.options)
    return present(args, result)
