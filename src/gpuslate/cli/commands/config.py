"""``gpuslate config [--config PATH] [--units] [-q] [--json]``: check the unit file and show it
resolved, as ``docker compose config`` (units/unitfile.py)."""

from __future__ import annotations

import argparse
import sys

from ...options import CONFIG_HELP
from ...units.unitfile import resolved
from ..exits import ExitStatus, exit_epilog
from . import present
from .common import add_common, describe


def build(p: argparse.ArgumentParser) -> None:
    """Its options (the parser is made from its row of the command table, with its summary)."""
    describe(p, description="Check the unit file (gpuslate.toml: found here or in a folder above, or named by "
             "$GPUSLATE_CONFIG or --config) and print it resolved, as 'docker compose config': every unit as 'up "
             "NAME' would start it, every key with its default filled in and its paths made absolute. The first "
             "mistake is one line with its FILE:LINE and exit 2, before anything is started.",
             examples=[("check the unit file and show what each unit will run with", "gpuslate config"),
                       ("only check it (a script, a CI step): exit 0 or 2", "gpuslate config -q"),
                       ("the names of its units, one a line", "gpuslate config --units"),
                       ("another file, as a document", "gpuslate config --config deploy/gpuslate.toml --json")],
             epilog=exit_epilog({0: "valid", 2: "no unit file, or a mistake in it (FILE:LINE)",
                                 5: "a unit file found above this folder that is not yours to trust"},
                                backend=False))
    add_common(p)
    p.add_argument("--config", metavar="PATH", help=CONFIG_HELP)
    p.add_argument("--units", action="store_true", help="print only the units' names, one a line (compose's "
                   "--services)")
    p.add_argument("-q", "--quiet", action="store_true", help="only check: print nothing, exit 0 or 2")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    result = resolved(args.config)
    if args.quiet:
        return ExitStatus.OK
    if args.units and not args.json:
        sys.stdout.write("".join(f"{u.name}\n" for u in result.units))
        sys.stdout.flush()
        return ExitStatus.OK
    return present(args, result)
