"""Options and output shared by every command. Only the CLI prints or exits."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ..._parse import parse_gpu_list, parse_gpu_selection, parse_int, parse_seconds, parse_size
from ..._record import MISSING, Consent, Form, Record
from ...commandline import arguments, consent_flags, words
from ...errors import GpuslateError, NotConfirmed, UsageError
from ...verbs import Verb
from ..exits import error_type_for
from ..render.output import quietly


def describe(parser: argparse.ArgumentParser, *, description: str, epilog: str,
             examples: Sequence[tuple[str, str]] = ()) -> None:
    """A command's help beyond its summary (which is in its row of the command table): its
    description, and after its options its examples (``(what it does, the command)``) and
    ``epilog`` (its exit codes)."""
    parser.description, parser.epilog = description, with_examples(examples, epilog)


def with_examples(examples: Sequence[tuple[str, str]], epilog: str | None) -> str:
    """An ``examples:`` block (each a comment line, then the command), then ``epilog``: the end of a
    ``--help`` (the help formatter keeps the block's lines as they are: cli/main.py)."""
    lines = ["examples:"]
    for why, command in examples:
        lines += [f"  # {why}"] * bool(why) + [f"  {command}"]
    return "\n\n".join(part for part in ("\n".join(lines) if examples else "", epilog or "") if part)


def add_common(parser: argparse.ArgumentParser, *, top: bool = False, sim_help: str | None = None) -> None:
    """--sim and --json, accepted both before and after the command name; ``sim_help``: what --sim
    means for a command that does not take ``$GPUSLATE_SIM`` (the demo's temporary host)."""
    # SUPPRESS keeps a subcommand's default from overwriting the top-level value
    default = None if top else argparse.SUPPRESS
    parser.add_argument("--sim", metavar="DIR", default=default, help=sim_help or
                        "use the simulated host in DIR (default: $GPUSLATE_SIM, else the NVIDIA driver)")
    parser.add_argument("--json", action="store_true", default=False if top else argparse.SUPPRESS,
                        help="print the versioned JSON document instead of a table")


def add_line(parser: argparse.ArgumentParser, line: type[Record], *, word: str | None = None) -> None:
    """The options of a verb's command line (its declaration's line: gpuslate/options.py), in their
    order, each field's dest its name (:meth:`gpuslate.verbs.Verb.read` reads them back). ``word``:
    the command word it is run by, when that is an old name (``log``): its alias field is set."""
    for f in arguments(line):
        arg = f.arg
        assert arg is not None
        shown: dict[str, Any] = {"help": arg.help} if arg.help is not None else {}
        if arg.form is Form.FLAG:
            parser.add_argument(*arg.flags, dest=f.name, action="store_const", const=arg.set_to, default=arg.absent,
                                required=arg.required, **shown)
        elif arg.form is Form.OPTION:
            assert arg.parse is not None
            how: dict[str, Any] = ({"action": "append", "default": None} if arg.nargs is not None else
                                   {"nargs": "?", "const": arg.const, "default": arg.absent}
                                   if arg.const is not MISSING else {"default": arg.absent})
            choices = arg.choices
            if isinstance(choices, str):  # "module:attr": names kept with what they name (the engines)
                module, _, attr = choices.partition(":")
                choices = getattr(importlib.import_module(module), attr)
            parser.add_argument(*arg.flags, dest=f.name, type=argument_type(arg.parse), metavar=arg.metavar,
                                choices=choices, **how, **shown)
        elif arg.form is Form.POSITIONAL:
            assert arg.parse is not None
            parser.add_argument(f.name, metavar=arg.metavar, type=argument_type(arg.parse), nargs=arg.nargs, **shown)
        elif arg.form is Form.REST:
            words_after_dashes(parser, f.name)
        elif arg.form is Form.ALIAS:
            parser.set_defaults(**{f.name: word == arg.flags[0]})


def add_yes(parser: argparse.ArgumentParser, verb: Verb[Any, Any]) -> None:
    """``-y/--yes`` of a verb that signals (its declaration's ``signals=True``): the consent it needs
    without a terminal (:meth:`~gpuslate.verbs.Verb.needs_consent`)."""
    parser.add_argument("-y", "--yes", dest="yes", action="store_true", default=False, help=verb.yes_help())


def stdin_is_terminal() -> bool:
    """Whether a person can be asked on stdin (a closed or redirected stdin cannot)."""
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (ValueError, OSError):
        return False


def require_consent(verb: Verb[Any, Any], args: argparse.Namespace) -> None:
    """A verb whose run needs consent, run without ``--yes`` and without a terminal on stdin to ask on:
    :class:`~gpuslate.errors.UsageError` (exit 2) before anything is started or signaled. Silence
    (a script, ``echo n |``, ``</dev/null``, cron) is never taken for consent."""
    line = verb.read(args)
    if not verb.needs_consent(line) or getattr(args, "yes", False) or stdin_is_terminal():
        return
    widened = [f for f in consent_flags(verb.line) if f in words(line)]
    what = " ".join([verb.name, *widened])
    dry = any(f.arg is not None and f.arg.consent is Consent.MOOT for f in arguments(verb.line))
    raise UsageError(f"'{what}' ends processes it does not name and asks first, but stdin is not a terminal: "
                     f"add --yes to go ahead (nothing was started or signaled"
                     f"{'; --dry-run shows the plan' if dry else ''})")


def argument_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse`` as argparse's ``type``: its UsageError is argparse's one-line error (exit 2)."""

    def read(text: str) -> Any:
        try:
            return parse(text)
        except UsageError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    read.__name__ = parse.__name__.replace("_", " ")  # argparse names the type in its own messages
    read.__wrapped__ = parse  # type: ignore[attr-defined]
    return read


def words_after_dashes(p: argparse.ArgumentParser, dest: str) -> None:
    """Everything after the first ``--`` is ``dest`` (a server's command), verbatim.

    argparse alone cannot do this once NAME was matched before the options
    (a ``nargs='*'`` positional is then already consumed, empty), so the
    words after ``--`` are taken off before this subcommand's parser runs.
    """
    parse = p.parse_known_args

    def parse_known_args(args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
                         ) -> tuple[argparse.Namespace, list[str]]:
        words = list(sys.argv[1:] if args is None else args)
        after: list[str] = []
        if "--" in words:
            i = words.index("--")
            words, after = words[:i], words[i + 1:]
        ns, extras = parse(words, namespace)
        setattr(ns, dest, after)
        return ns, extras

    p.parse_known_args = parse_known_args  # type: ignore[method-assign,assignment]


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


def positive_duration(text: str) -> float:
    """A duration (seconds, or ``90s``, ``1m30s``, ``500ms``), more than 0 and finite (at most ``MAX_SECONDS``)."""
    try:
        return parse_seconds(text, allow_zero=False)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def duration(text: str) -> float:
    """A duration (seconds, or ``90s``, ``1m30s``, ``500ms``), at least 0 and finite (at most ``MAX_SECONDS``)."""
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


def confirm_plan(plan: Any) -> bool:
    """On a terminal: show a clear plan (``clear``'s, ``up --clear``'s) on stderr, ask before any signal."""
    from ..render.clear import print_plan  # lazy: startup (only a terminal is asked)

    print_plan(plan, file=sys.stderr)
    n = len(plan.targets)
    sys.stderr.write(f"Terminate {'this process' if n == 1 else f'these {n} processes'}? [y/N] ")
    sys.stderr.flush()
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def note(msg: str) -> None:
    """A progress line for people, on stderr (stdout stays for the result or JSON).

    Escaped: progress lines quote process titles and the lock's holder file."""
    from ..render.styled import safe  # lazy: startup (rich's escaping: only a note or an error shows text)

    sys.stderr.write(f"gpuslate: {safe(msg)}\n")
    sys.stderr.flush()


def print_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    sys.stdout.flush()


def print_error(exc: BaseException, status: int, as_json: bool) -> None:
    """One line on stderr (plus a hint line when there is one); a JSON document with --json."""
    from ..render.styled import safe  # lazy: startup (rich's escaping: only a note or an error shows text)

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
