"""Entry point of the ``gpuslate`` command: parse (the parsers of the command table,
cli/commands/__init__.py: each made from its row, only the chosen one's options built), dispatch (the
chosen command's module, imported now), map errors to exit codes."""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

from .. import __version__
from .._parse import DURATION_HELP
from ..errors import GpuslateError, UsageError
from ..gpu import sim_root_from_env
from . import fleet as fleet_cli
from .commands import COMMANDS, Command, output_mode
from .commands.common import add_common, add_line, add_yes, print_error, require_consent, with_examples
from .exits import ExitStatus, exit_epilog, exit_status_for
from .render import output

_GLOBAL_WITH_VALUE = {"--sim"}


class _LazySubParsers(argparse._SubParsersAction):
    """Subcommands build their options only when chosen (``lazy_build``), so that ``gpuslate
    --help`` imports no command's module and ``gpuslate status`` does not pay for ``gpuslate sim
    serve``'s options."""

    def __call__(self, parser, namespace, values, option_string=None):
        chosen = self._name_parser_map.get(values[0]) if values else None
        build = getattr(chosen, "lazy_build", None)
        if build is not None:
            chosen.lazy_build = None  # type: ignore[union-attr]
            build(chosen)
        super().__call__(parser, namespace, values, option_string)


class _Formatter(argparse.HelpFormatter):
    """argparse's help, as wide as ``shutil.get_terminal_size`` says, without importing shutil (and
    its bz2 and lzma) at every start: argparse makes a formatter for every option it adds."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        super().__init__(prog, indent_increment, max_help_position, width if width is not None else _columns() - 2)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        """Paragraphs wrapped as argparse wraps them, but a block of indented lines (the examples) as written."""
        return "\n\n".join(indent + para.replace("\n", "\n" + indent) if "\n  " in para
                           else super(_Formatter, self)._fill_text(para, width, indent)
                           for para in text.split("\n\n"))


def _columns() -> int:
    """$COLUMNS, else the terminal's width on stdout, else 80: as ``shutil.get_terminal_size``."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns or 80  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):  # no stdout, not a terminal
            columns = 80
    return columns


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs) -> None:
        # only whole option names: a prefix (`--all` for --all-users) is an error, in every sub-parser too
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", _LazySubParsers)

    def error(self, message: str) -> None:  # type: ignore[override]
        # one line, the documented usage exit code; no usage dump
        sys.stderr.write(f"gpuslate: error: {message} ({did_you_mean(message, self)}see '{self.prog} --help')\n")
        sys.exit(ExitStatus.USAGE)


def did_you_mean(message: str, parser: argparse.ArgumentParser) -> str:
    """``did you mean 'status'? `` for an argparse error about a word close to a real one (a
    command, a choice, an option of the command given), else ``""``. The top parser knows the
    words it was given (``argv``, set by :func:`main`), to find the command's options."""
    import difflib  # lazy: startup (only on bad input)

    m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if m:
        choices = [c.strip().strip("'\"") for c in m.group(2).split(",")]
        close = difflib.get_close_matches(m.group(1), choices, n=1, cutoff=0.6)
        return f"did you mean '{close[0]}'? " if close else ""
    m = re.search(r"unrecognized arguments: (.*)", message)
    if not m:
        return ""
    # compared without their dashes, which every option shares ('--bogus' is not '--gpus')
    options = {o.lstrip("-"): o for o in _option_names(parser, getattr(parser, "argv", []))}
    for word in m.group(1).split():
        if word.startswith("-"):
            close = difflib.get_close_matches(word.partition("=")[0].lstrip("-"), list(options), n=1, cutoff=0.7)
            if close:
                return f"did you mean {options[close[0]]}? "
    return ""


def _option_names(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """The options of the (sub)command ``argv`` names, and the top parser's."""
    names = [o for a in parser._actions for o in a.option_strings]
    for word in argv:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if sub is None or word not in sub.choices:
            continue
        parser = sub.choices[word]
        names += [o for a in parser._actions for o in a.option_strings]
    return names


def _chosen_command(argv: Sequence[str]) -> str | None:
    """The command word of ``argv``, if it names a known command."""
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in _GLOBAL_WITH_VALUE:
            skip = True
        elif not arg.startswith("-"):
            return arg if arg in COMMANDS else None
    return None


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser; given ``argv`` naming a command, only that command's parser is made (start-up
    time is part of every command's cost). Each command's options are built when it is chosen
    (:func:`build_command`): ``--help`` lists the commands from their rows alone."""
    parser = _Parser(
        prog="gpuslate",
        description="Safe, verified, fast hand-off of NVIDIA GPUs between model-server deployments.",
        epilog=exit_epilog({1: "internal error (a bug: please report it)", 4: "not done within the timeout",
                            5: "permission denied, or an unsafe state folder", 6: "a managed server failed",
                            7: "partial: some targets failed"}) + " Each command's --help lists its own.",
    )
    parser.add_argument("--version", action="version", version=f"gpuslate {__version__}")
    add_common(parser, top=True)
    fleet_cli.add_fleet_help(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    chosen = _chosen_command(argv) if argv is not None else None
    for word, row in COMMANDS.items():  # the command table (cli/commands/__init__.py), in help order
        if chosen is None or word == chosen:
            shown: dict[str, Any] = {"help": row.summary} if row.summary is not None else {}  # none: hidden
            p = sub.add_parser(word, **shown)
            p.lazy_build = functools.partial(build_command, word, row)  # type: ignore[attr-defined]
    return parser


def build_command(word: str, row: Command, p: argparse.ArgumentParser) -> None:
    """``gpuslate WORD``'s options: a verb's from its declaration (gpuslate/verbs.py), run by its
    module's ``run``; another command's by its module's ``build``."""
    verb = row.verb
    if verb is None:
        importlib.import_module(f"{__package__}.commands.{row.module}").build(p)
    else:
        p.description, p.usage = verb.description, verb.usage
        p.epilog = with_examples(verb.examples, exit_epilog(row.exits, backend=row.backend))
        add_common(p)
        add_line(p, verb.line, word=word)
        if verb.signals:
            add_yes(p, verb)
        p.set_defaults(handler=functools.partial(_run, row.module))
    _say_units(p)


#: what a SIZE and a DURATION are, said in every --help that has one (the parsers: gpuslate/_parse.py)
_UNIT_NOTES = {"SIZE": "  SIZE      40GiB, 512MiB or 40G (binary, as docker's -m: G = GB = GiB);\n"
                       "            a number alone is refused, 0 excepted",
               "DURATION": f"  DURATION  {DURATION_HELP}"}


def _say_units(p: argparse.ArgumentParser) -> None:
    """A paragraph before the exit codes of ``p``'s help (and its subcommands') saying what its SIZE
    and DURATION values are: one place, so that every command says the same."""
    metavars = {a.metavar for a in p._actions}
    notes = [note for metavar, note in _UNIT_NOTES.items() if metavar in metavars]
    if notes and p.epilog and "\nvalues:\n" not in f"\n{p.epilog}\n":
        paras = p.epilog.split("\n\n")
        at = next((i for i, para in enumerate(paras) if para.startswith("exit status:")), len(paras))
        p.epilog = "\n\n".join([*paras[:at], "\n".join(["values:", *notes]), *paras[at:]])
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for sub in dict.fromkeys(a.choices.values()):
                build = getattr(sub, "lazy_build", None)
                if build is not None:  # its options come when it is chosen: said then
                    sub.lazy_build = functools.partial(_built_then_said, build)
                else:
                    _say_units(sub)


def _built_then_said(build: Any, p: argparse.ArgumentParser) -> None:
    build(p)
    _say_units(p)


def _run(module: str, args: argparse.Namespace) -> int:
    """A verb's command: its module's ``run``, the module imported now (not to list or parse it)."""
    return int(importlib.import_module(f"{__package__}.commands.{module}").run(args))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:  # -H/--host, --hosts, --group...: taken off here, wherever they are (see cli/fleet.py)
        fleet, argv = fleet_cli.split_fleet_options(argv)
    except UsageError as exc:  # a malformed --parallel, a missing value: nothing was contacted
        print_error(exc, ExitStatus.USAGE, "--json" in argv)
        return ExitStatus.USAGE
    parser = build_parser(argv)
    parser.argv = argv  # type: ignore[attr-defined]  # for did_you_mean
    args = parser.parse_args(argv)  # with --host too: bad input fails here, before any host is contacted
    output.set_mode(output_mode(_chosen_command(argv), args))
    if not getattr(args, "handler", None):
        parser.print_help(sys.stderr)
        return ExitStatus.USAGE
    try:
        row = COMMANDS.get(_chosen_command(argv) or "")
        if row is not None and row.verb is not None:  # silence is no consent: here and for every host alike
            require_consent(row.verb, args)
        if fleet is not None:  # the same command on every selected host
            return int(fleet_cli.run(fleet, _chosen_command(argv) or "", argv, args))
        _use_sim(args)
        return int(args.handler(args))
    except output.OutputLost:  # `gpuslate status | head -1`, `>&-`: see cli/render/output.py
        return ExitStatus.OUTPUT_LOST
    except KeyboardInterrupt as exc:
        try:
            print_error(exc if str(exc) else KeyboardInterrupt("interrupted"), ExitStatus.INTERRUPTED, args.json)
        except (OSError, ValueError):  # hung up (SIGHUP): the terminal is gone, the status still tells
            pass
        return ExitStatus.INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - the last resort: an exit status and one line, never a traceback
        status = exit_status_for(exc)
        if status == ExitStatus.INTERNAL_ERROR and not _is_gpuslate_error(exc):
            import traceback  # lazy: startup (only for a bug)

            traceback.print_exc()
        print_error(exc, status, args.json)
        return status


def _use_sim(args: argparse.Namespace) -> None:
    """``--sim DIR``: checked first (exit 3 for no simulated host, whatever the
    command), then one simulated host for the whole run: the backend, the lock,
    the state folder (audit log, units) and the servers ``up`` starts follow it. Without it, a
    relative ``$GPUSLATE_SIM`` is refused here, for every command (exit 2), whether it would read it
    or not (:func:`~gpuslate.gpu.sim_root_from_env`)."""
    if getattr(args, "sim_command", None) == "init":
        return
    if not getattr(args, "sim", None):
        sim_root_from_env()
        return
    from ..gpu.simhost.host import SimHost  # lazy: startup (only with --sim)

    root = os.path.abspath(args.sim)
    SimHost(root).config  # noqa: B018 - raises BackendUnavailable when DIR is none
    os.environ["GPUSLATE_SIM"] = root


def _is_gpuslate_error(exc: BaseException) -> bool:
    return isinstance(exc, GpuslateError)


def run() -> None:
    """Console-script entry point.

    The command is done when ``main`` returns: the output is flushed and the
    process leaves without the interpreter's teardown (freeing every module
    object, 5-20 ms, as long as the rest of a ``status``). Nothing in gpuslate
    registers exit handlers or leaves non-daemon threads at this point, and the
    kernel and the driver release the process's files and NVML state either way.
    """
    output.open_standard_fds()
    output.guard_streams()  # a closed stdout or a reader gone: cli/render/output.py decides, for every command
    try:
        try:
            code = main()
        except SystemExit:  # argparse's --help, --version and usage errors, after their output
            sys.stdout.flush()
            raise
        sys.stdout.flush()
    except output.OutputLost:
        code = ExitStatus.OUTPUT_LOST
    with output.quietly():
        sys.stderr.flush()
    os._exit(code)
