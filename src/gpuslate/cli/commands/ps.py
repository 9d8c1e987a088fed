"""``gpuslate ps``: the managed units and their live state (its options: gpuslate/verbs.py's PS)."""

from __future__ import annotations

import argparse

from ...api import Host
from ...verbs import PS
from . import present


def run(args: argparse.Namespace) -> int:
    line = PS.read(args)
    with Host.open(getattr(args, "sim", None)) as host:
        result = host.ps(line.options)
    return present(args, result)
