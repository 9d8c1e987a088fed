"""``gpuslate wait --free``: wait until GPUs are free; signals nothing (its options: gpuslate/verbs.py's WAIT)."""

from __future__ import annotations

import argparse

from ...api import Host
from ...verbs import WAIT
from ..render.live import LiveLine
from . import present


def run(args: argparse.Namespace) -> int:
    line = WAIT.read(args)
    with LiveLine.of(args) as live:
        result = Host.open(args.sim, on_progress=live.sink).wait(line.gpus, line.options)
    return present(args, result)
