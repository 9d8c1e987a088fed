"""``gpuslate audit``: every signal gpuslate sent, and what became of it (its options:
gpuslate/verbs.py's AUDIT).

``gpuslate log`` is its old name (too close to ``logs``, a unit's output): a
hidden alias that says so on stderr and keeps its ``gpuslate.log.v1`` document.
"""

from __future__ import annotations

import argparse

from ...api import Host
from ...verbs import AUDIT
from . import present
from .common import note


def run(args: argparse.Namespace) -> int:
    line = AUDIT.read(args)
    if line.options.old_name:
        note("'gpuslate log' is now 'gpuslate audit' (the old name will go away)")
    with Host.open(getattr(args, "sim", None)) as host:  # its state folder; no GPU is needed
        listing = host.audit(line.options)
    return present(args, listing)
