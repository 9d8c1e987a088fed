"""The command line, and its console script ``gpuslate``, which opens the NVIDIA driver before the
CLI is imported.

The driver's initialisation and the first handle of each GPU (about 18 ms on an
H200 host, C code that runs without the GIL) are the longest step of ``status``
and ``clear`` before anything is shown or signaled. Started here, ahead of the
CLI's own imports (argparse, the command's modules), they overlap them.

Whether to start is decided from the raw arguments alone, conservatively: a
wrong guess costs time (an early start is harmless, and a missing one is made
up later), never a different result; :mod:`.main` parses and checks everything.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

#: commands that open the driver first thing
EARLY_COMMANDS = frozenset({"status", "clear", "wait"})
#: options after which the local driver is not wanted first (help, a simulated host, other hosts)
_NOT_EARLY = frozenset({"-h", "--help", "--sim", "--host", "--hosts", "--group", "--version"})


def early_command(argv: Sequence[str]) -> str | None:
    """The command of ``argv`` if it will open the local NVIDIA driver, else None."""
    if os.environ.get("GPUSLATE_SIM"):
        return None
    command = None
    for arg in argv:
        if arg == "--":
            break
        if arg.split("=", 1)[0] in _NOT_EARLY or (arg.startswith("-H") and not arg.startswith("--")):
            return None
        if command is None and not arg.startswith("-"):
            command = arg
    return command if command in EARLY_COMMANDS else None


def run() -> None:
    """Console-script entry point (see :func:`gpuslate.cli.main.run`)."""
    command = early_command(sys.argv[1:])
    if command is not None:
        from ..gpu.nvml import start_early_init  # lazy: startup; only the commands that open the driver load it

        # status shows nothing but a first full reading: it is taken meanwhile too
        start_early_init(prefetch=command == "status")
    from .main import run as run_cli  # lazy: startup; after the driver's start: overlapping it is this module's purpose

    run_cli()
