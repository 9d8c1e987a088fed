"""Options and output shared by every command. Only the CLI prints or exits."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..._parse import parse_gpu_list, parse_gpu_selection, parse_int, parse_seconds, parse_size
from ...errors import GpuslateError, NotConfirmed, UsageError
from ..exits import error_type_for
from ..render.output import quietly


def add_common(parser: argparse.ArgumentParser, *, top: bool = False, sim_help: str | None = None) -> None:
    """--sim and --json, accepted both before and after the command name; ``sim_help``: what --sim
    means for a command that does not take ``$GPUSLATE_SIM`` (the demo's temporary host)."""
    # SUPPRESS keeps a subcommand's default from overwriting the top-level value
    default = None if top else argparse.SUPPRESS
    parser.add_argument("--sim", metavar="DIR", default=default, help=sim_help or
                        "use the simulated host in DIR (default: $GPUSLATE_SIM, else the NVIDIA driver)")
    parser.add_argument("--json", action="store_true", default=False if top else argparse.SUPPRESS,
                        help="print the versioned JSON document instead of a table")


def gpu_list(text: str) -> list[int]:
    try:
        return parse_gpu_list(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def gpus_arg(text: str) -> list[int] | str:
    """A ``--gpus`` value: a GPU list, or ``all`` (docker's spelling): every GPU
    (:func:`~gpuslate._parse.selected_gpus` turns it into the GPUs chosen)."""
    try:
        return parse_gpu_selection(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc) + ", or all") from None


def size(text: str) -> int:
    try:
        return parse_size(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_float(text: str) -> float:
    """Seconds, more than 0 and finite (at most ``MAX_SECONDS``)."""
    try:
        return parse_seconds(text, allow_zero=False)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def nonnegative_float(text: str) -> float:
    """Seconds, at least 0 and finite (at most ``MAX_SECONDS``)."""
    try:
        return parse_seconds(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def whole(low: int, high: int):
    """An argparse type: a whole number in ASCII digits from ``low`` to ``high``
    (``int`` alone takes full-width digits and numbers of any length)."""

    def parse(text: str) -> int:
        try:
            return parse_int(text, low=low, high=high)
        except UsageError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = "whole number"  # argparse names the type in its own messages
    return parse


#: argparse types for process ids and ports
pid_type = whole(1, 2**31 - 1)
port_type = whole(1, 65535)


def note(msg: str) -> None:
    """A progress line for people, on stderr (stdout stays for the result or JSON).

    Escaped: progress lines quote process titles and the lock's holder file."""
    from ..render.styled import safe  # lazy: startup

    sys.stderr.write(f"gpuslate: {safe(msg)}\n")
    sys.stderr.flush()


def print_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    sys.stdout.flush()


def print_error(exc: BaseException, status: int, as_json: bool) -> None:
    """One line on stderr (plus a hint line when there is one); a JSON document with --json."""
    from ..render.styled import safe  # lazy: startup

    msg = str(exc) or exc.__class__.__name__
    hint = exc.hint if isinstance(exc, GpuslateError) else None
    # one line each, escaped: messages can quote process titles and file contents; a "no" to a
    # question is the person's answer, not an error
    label = "" if isinstance(exc, NotConfirmed) else "error: "
    with quietly():  # an error that cannot be shown (stderr gone) still leaves with its own code
        sys.stderr.write(f"gpuslate: {label}{safe(' '.join(msg.splitlines()))}\n")
        if hint:
            sys.stderr.write(f"gpuslate: hint: {safe(' '.join(hint.splitlines()))}\n")
        sys.stderr.flush()
        if as_json:
            print_json({"schema": "gpuslate.error.v1", "error": {"type": error_type_for(exc), "message": msg,
                                                                  "hint": hint, "exit_code": int(status)}})
