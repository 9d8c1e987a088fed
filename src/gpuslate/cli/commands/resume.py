"""``gpuslate resume NAME``: bring a parked unit back, its memory proven back and its answer the same as
before the park (its options: gpuslate/verbs.py's RESUME; docs/units.md, Park and resume)."""

from __future__ import annotations

import argparse
import signal

from ...api import Host
from ...units.interrupts import deferred_interrupts
from ...verbs import RESUME
from ..render.live import LiveLine
from . import present


def run(args: argparse.Namespace) -> int:
    line = RESUME.read(args)
    with deferred_interrupts(signals=(signal.SIGHUP,)), LiveLine.of(args) as live, \
            Host.open(getattr(args, "sim", None), on_event=live.note, on_progress=live.sink) as host:
        result = host.resume(line.name, line.options)
    return present(args, result)
