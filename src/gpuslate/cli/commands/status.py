"""``gpuslate status``: every GPU and every process that holds it (its options: gpuslate/verbs.py's STATUS)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from ...api import Host
from ...options import StatusLine
from ...verbs import STATUS
from ..exits import ExitStatus
from ..render.output import OutputLost
from . import present


def run(args: argparse.Namespace) -> int:
    line = STATUS.read(args)
    host = Host.open(getattr(args, "sim", None))
    if line.watch:
        with host:
            return _watch(args, line, host)
    # Not closed for one snapshot: the process exits now and the driver releases
    # everything; nvmlShutdown would add milliseconds to every call.
    return present(args, host.status(line.gpus))  # --compact: the row's compact view


def _watch(args: argparse.Namespace, line: StatusLine, host: Host) -> int:
    assert line.watch is not None
    try:
        if args.json:
            while True:
                sys.stdout.write(json.dumps(host.status(line.gpus).to_json()) + "\n")
                sys.stdout.flush()
                time.sleep(line.watch)
        from ..render.status import print_compact, print_status  # lazy: startup (status --json shows no table)

        show = print_compact if line.compact else print_status
        while True:
            show(host.status(line.gpus), redraw=True)
            time.sleep(line.watch)
    except OutputLost:  # the reader went away: 141, not a Ctrl-C (cli/render/output.py)
        raise
    except KeyboardInterrupt:
        return ExitStatus.OK  # Ctrl-C is how a watch ends: not a failure
