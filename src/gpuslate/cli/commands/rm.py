"""``gpuslate rm NAME...``: remove the records and logs of units nothing of which runs (``docker rm``).
Its options: gpuslate/verbs.py's RM."""

from __future__ import annotations

import argparse

from ...api import Host
from ...verbs import RM
from . import present


def run(args: argparse.Namespace) -> int:
    line = RM.read(args)
    with Host.open(getattr(args, "sim", None)) as host:
        result = host.rm(list(dict.fromkeys(line.names)))
    return present(args, result)
