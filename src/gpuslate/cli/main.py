"""Entry point of the ``gpuslate`` command: parse, dispatch, map errors to exit codes."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from . import clear as clear_cmd
from . import log as log_cmd
from . import sim as sim_cmd
from . import status as status_cmd
from .common import add_common, print_error
from .exits import ExitStatus, exit_status_for

COMMANDS = (status_cmd, clear_cmd, log_cmd, sim_cmd)


class _LazySubParsers(argparse._SubParsersAction):  # type: ignore[type-arg]
    """Subcommands whose options need heavy imports build them only when chosen,
    so that `gpuslate status` does not pay for `gpuslate sim serve`'s options."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        chosen = self._name_parser_map.get(values[0]) if values else None
        build = getattr(chosen, "lazy_build", None)
        if build is not None:
            chosen.lazy_build = None  # type: ignore[union-attr]
            build(chosen)
        super().__call__(parser, namespace, values, option_string)


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", _LazySubParsers)

    def error(self, message: str) -> None:  # type: ignore[override]
        # one line, the documented usage exit code; no usage dump
        sys.stderr.write(f"gpuslate: error: {message} (see '{self.prog} --help')\n")
        sys.exit(ExitStatus.USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gpuslate",
        description="Safe, verified, fast hand-off of NVIDIA GPUs between model-server deployments.",
    )
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"gpuslate {__version__}")
    add_common(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module in COMMANDS:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help(sys.stderr)
        return ExitStatus.USAGE
    try:
        return int(args.handler(args))
    except KeyboardInterrupt as exc:
        print_error(exc if str(exc) else KeyboardInterrupt("interrupted"), ExitStatus.INTERRUPTED, args.json)
        return ExitStatus.INTERRUPTED
    except BrokenPipeError:  # `gpuslate status | head`: not an error worth a traceback
        return ExitStatus.OK
    except Exception as exc:
        status = exit_status_for(exc)
        if status == ExitStatus.INTERNAL_ERROR and not _is_gpuslate_error(exc):
            import traceback

            traceback.print_exc()
        print_error(exc, status, args.json)
        return status


def _is_gpuslate_error(exc: BaseException) -> bool:
    from ..errors import GpuslateError

    return isinstance(exc, GpuslateError)


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
