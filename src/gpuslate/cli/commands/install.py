"""``gpuslate --host H install``: gpuslate on hosts without a package index.

It runs here, not on the host: the zipapp of this gpuslate is built once
(:mod:`gpuslate.remote.zipapp`), then each host gets it over its SSH
connection (in parallel, like every ``--host`` command), is checked for
Python >= 3.10 first, and runs it once to prove it works. Each host's
``gpuslate.install.v1`` document sits in the run's ``gpuslate.fleet.v1``.
Without ``--host``: ``--out FILE`` writes the zipapp here (``python3 FILE``
runs it); neither is a usage error. See docs/remote.md.

The library modules load on use (in the functions): shell completion imports
this module for its options, and they need zipapp, tempfile, shutil.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ... import __version__
from ...errors import UsageError
from ..exits import exit_epilog
from . import present
from .common import add_common, describe, note

if TYPE_CHECKING:
    from ...remote.hosts import HostSpec
    from ...remote.ssh import SshOptions
    from ...remote.zipapp import ZipappPush


def build(p: argparse.ArgumentParser) -> None:
    """Its options (the parser is made from its row of the command table, with its summary)."""
    describe(p, examples=[("gpuslate on a host without it (and without a package index), over ssh",
                          "gpuslate --host root@gpu-host install"),
                         ("every host of an inventory, then their GPUs", "gpuslate --hosts hosts.ini install"),
                         ("the file alone, to copy yourself ('python3 gpuslate.pyz status' runs it)",
                          "gpuslate install --out gpuslate.pyz")],
             description="Build a single-file zipapp of this gpuslate and copy it to each --host over ssh: "
                       "PREFIX/share/gpuslate/gpuslate.pyz and the launcher PREFIX/bin/gpuslate (PREFIX "
                       "~/.local). The host's Python (>= 3.10) is checked first; the installed gpuslate is run "
                       "once (--version, status --json) to prove it works. Without --host: --out FILE writes "
                       "the zipapp here. See docs/remote.md.",
                       epilog=exit_epilog({0: "installed (or written: --out)",
                                           2: "bad input, or neither --host nor --out",
                                           3: "a host without Python >= 3.10, or unreachable",
                                           5: "the files could not be written there (or --out here)",
                                           7: "some hosts failed"}))
    add_common(p)
    p.add_argument("--prefix", default="~/.local", metavar="DIR",
                   help="where on the host: DIR/share/gpuslate/gpuslate.pyz and DIR/bin/gpuslate "
                   "(default ~/.local; another DIR needs GPUSLATE_REMOTE_COMMAND=DIR/bin/gpuslate here)")
    p.add_argument("--python", default="python3", metavar="CMD",
                   help="the host's interpreter (default python3; must be Python >= 3.10)")
    p.add_argument("--out", metavar="FILE", help="without --host: write the zipapp here (run it: python3 FILE)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Without --host: ``--out FILE`` writes the zipapp here."""
    from ...remote.zipapp import build, write_local  # lazy: startup (completion loads this module)

    if not args.out:
        raise UsageError("install copies gpuslate to remote hosts: give --host HOST (or --out FILE to write "
                         "the zipapp here)")
    result = write_local(build(), args.out)
    return present(args, result)


def push(args: argparse.Namespace, hosts: Sequence[HostSpec], opts: SshOptions, parallel: int) -> ZipappPush:
    """The transport that installs on ``hosts`` (remote/zipapp.py's ZipappPush): the zipapp built once, here."""
    from ...remote.zipapp import ZipappPush, build, check_prefix  # lazy: startup (completion loads this module)

    if args.out:
        raise UsageError("--out writes the zipapp here: give it without --host")
    prefix = check_prefix(args.prefix)
    if not args.python or args.python.startswith("-"):
        raise UsageError(f"invalid --python {args.python!r}: a command or path on the host")
    archive = build()
    if not args.json:
        note(f"built the zipapp of gpuslate {__version__}: {len(archive.data) / 1e6:.1f} MB, sha256 "
             f"{archive.sha256[:12]} (bundled: {', '.join(archive.included) or 'nothing'})")
    return ZipappPush(hosts, opts, archive, prefix=prefix, python=args.python, parallel=parallel)
