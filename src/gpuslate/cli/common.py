"""Options and output shared by every command. Only the CLI prints or exits."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .._parse import parse_gpu_list, parse_size
from ..errors import GpuslateError, UsageError
from ..gpu import GpuBackend, open_backend


def add_common(parser: argparse.ArgumentParser, *, top: bool = False) -> None:
    """--sim and --json, accepted both before and after the command name."""
    # SUPPRESS keeps a subcommand's default from overwriting the top-level value
    default = None if top else argparse.SUPPRESS
    parser.add_argument("--sim", metavar="DIR", default=default,
                        help="use the simulated host in DIR (default: $GPUSLATE_SIM, else the NVIDIA driver)")
    parser.add_argument("--json", action="store_true", default=False if top else argparse.SUPPRESS,
                        help="print the versioned JSON document instead of a table")


def gpu_list(text: str) -> list[int]:
    try:
        return parse_gpu_list(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def size(text: str) -> int:
    try:
        return parse_size(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None
    if not v > 0 or v != v or v == float("inf"):
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: must be a number greater than 0")
    return v


def nonnegative_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None
    if not v >= 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: must be a number of at least 0")
    return v


def backend_for(args: argparse.Namespace) -> GpuBackend:
    return open_backend(getattr(args, "sim", None))


def note(msg: str) -> None:
    """A progress line for people, on stderr (stdout stays for the result or JSON)."""
    sys.stderr.write(f"gpuslate: {msg}\n")
    sys.stderr.flush()


def print_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    sys.stdout.flush()


def print_error(exc: BaseException, status: int, as_json: bool) -> None:
    """One line on stderr (plus a hint line when there is one); a JSON document with --json."""
    msg = str(exc) or exc.__class__.__name__
    hint = exc.hint if isinstance(exc, GpuslateError) else None
    sys.stderr.write(f"gpuslate: error: {msg}\n")
    if hint:
        sys.stderr.write(f"gpuslate: hint: {hint}\n")
    if as_json:
        code = exc.code if isinstance(exc, GpuslateError) else "internal"
        print_json({"schema": "gpuslate.error.v1",
                    "error": {"type": code, "message": msg, "hint": hint, "exit_code": int(status)}})
