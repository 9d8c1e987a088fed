"""Every verb's declaration (gpuslate/verbs.py), walked field by field: each option goes through the
command line (argv), the typed line the command reads from it, and the command line another host is
sent, and comes back the same; what cannot be sent is refused before anything is.

The lines are drawn by hypothesis from the declarations themselves (gpuslate/options.py): each field's
form (flag, option, positional, the words after ``--``) and a value its parser reads (one strategy per
parser, below). A field added to a verb is walked here without a line of this file, unless it brings a
parser of its own: then the test of every field's parser fails, naming it.
"""

from __future__ import annotations

import math
import string
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuslate import options, verbs
from gpuslate._parse import MAX_GPU_INDEX, MAX_SECONDS, MAX_SIZE, format_front, parse_size
from gpuslate._record import MISSING, Field, Form, Record
from gpuslate.cli.commands import COMMANDS
from gpuslate.cli.main import build_parser
from gpuslate.commandline import arguments
from gpuslate.errors import UsageError
from gpuslate.units.spec import ENGINES

VERBS: dict[str, verbs.Verb[Any, Any]] = {v.name: v for v in vars(verbs).values() if isinstance(v, verbs.Verb)}

_NAME = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,20}", fullmatch=True)
# "--" alone is refused on both sides (test_a_value_of_two_dashes_is_refused): argparse drops it
_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12).filter(
    lambda s: s != "--")
_GPUS = st.lists(st.integers(0, MAX_GPU_INDEX), min_size=1, max_size=5, unique=True).map(sorted)


def _seconds(low_open: bool) -> st.SearchStrategy[float]:
    return st.floats(0.0, MAX_SECONDS, allow_nan=False, exclude_min=low_open)


#: a value of what each parser reads, as it reads it (None: the field's absent value is drawn apart)
VALUES: dict[Any, st.SearchStrategy[Any]] = {
    options.seconds: _seconds(False),
    options.positive_seconds: _seconds(True),
    parse_size: st.integers(0, MAX_SIZE),
    options.gpu_selection: _GPUS.map(tuple),
    options.unit_gpus: st.one_of(_GPUS, st.just("all")),
    options.pid: st.integers(1, 2**31 - 1),
    options.port: st.integers(1, 65535),
    options.text: _TEXT,
    options.unit_name: _NAME,
    options.env_item: st.tuples(st.text(string.ascii_letters + "_", min_size=1, max_size=6), _TEXT).map("=".join),
    options.limit: st.integers(0, 10**6),
    options.tail: st.integers(0, 10**9),
    # a time since 1970: 0, or a moment written in the few dozen characters --since takes
    options.since: st.one_of(st.just(0.0), st.floats(1e-3, 4e9, allow_nan=False)),
    options.containment: st.sampled_from(list(options.Containment)),
    options.park_way: st.sampled_from(list(options.ParkWay)),
    # a front's address as --front writes it back (HOST:PORT; [::1]:PORT)
    options.front_address: st.tuples(st.sampled_from(["127.0.0.1", "0.0.0.0", "::1", "localhost"]),
                                     st.integers(1, 65535)).map(lambda hp: format_front(*hp)),
}


def _value(f: Field) -> st.SearchStrategy[Any]:
    """A value of field ``f`` that its command line can say (a field that cannot cross keeps its default)."""
    arg = f.arg
    assert arg is not None
    if arg.why_here is not None:  # stays here: refused over there (test_what_cannot_be_sent_is_refused)
        return st.just(arg.absent)
    if arg.form is Form.FLAG:  # a required one (wait --free) is always given
        return st.sampled_from([arg.set_to] if arg.required else [arg.absent, arg.set_to])
    if arg.form is Form.ALIAS:
        return st.booleans()
    if arg.form is Form.REST:
        return st.lists(_TEXT, max_size=4).map(tuple)
    value = VALUES[arg.parse]
    if arg.choices is not None:  # the engines' names: what argparse allows
        value = st.sampled_from(ENGINES if isinstance(arg.choices, str) else arg.choices)
    if arg.form is Form.POSITIONAL:
        if arg.nargs is None:
            return value
        return st.lists(value, min_size=1 if arg.nargs == "+" else 0, max_size=3).map(tuple)
    if arg.nargs is not None:  # a repeatable option
        return st.lists(value, max_size=3).map(tuple)
    return st.one_of(st.just(arg.absent), value)


def _line(cls: type[Record]) -> st.SearchStrategy[Record]:
    """A record of ``cls`` whose every field the command line has is drawn; the others keep their default."""
    drawn: dict[str, st.SearchStrategy[Any]] = {}
    for name, f in cls._fields.items():
        if f.arg is None:
            continue
        drawn[name] = _line(f.arg.record) if f.arg.form is Form.GROUP and f.arg.record else _value(f)
    return st.fixed_dictionaries(drawn).map(lambda values: cls(**values))


def _bare(cls: type[Record]) -> Record:
    """A line of ``cls`` with only what it cannot go without: each unit name it requires ("a")."""
    return cls(**{name: ("a",) if f.arg.nargs else "a" for name, f in cls._fields.items()
                  if f.arg is not None and f.arg.form is Form.POSITIONAL and f.default is MISSING})


def _parsed(argv: list[str]) -> Any:
    """argv as ``gpuslate`` parses it: the parser made from the command table, the command's options built."""
    return build_parser(argv).parse_args(argv)


def test_every_declared_verb_has_its_row():
    assert set(VERBS) == {"status", "clear", "wait", "up", "down", "restart", "rm", "ps", "logs", "swap", "audit",
                          "park", "resume"}
    for name, verb in VERBS.items():
        assert COMMANDS[name].verb is verb
    assert COMMANDS["log"].verb is verbs.AUDIT  # the old name


@pytest.mark.parametrize("name", sorted(VERBS))
def test_every_field_has_a_parser_with_values_and_help(name):
    """Each field of the verb's line: a parser this file draws values of, its help, a dest of its own."""
    seen: set[str] = set()
    for f in arguments(VERBS[name].line):
        arg = f.arg
        assert arg is not None and f.name not in seen, f.name
        seen.add(f.name)
        if arg.form in (Form.OPTION, Form.POSITIONAL):
            assert arg.parse in VALUES, f"{name} {arg.long}: no values for its parser {arg.parse!r}: add them here"
        if arg.form is not Form.POSITIONAL:
            assert arg.help, (name, f.name)


@pytest.mark.parametrize("name", sorted(VERBS))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_argv_to_options_to_remote_argv_to_options_is_the_identity(name, data):
    """A line drawn from the declaration, as its remote command line, read by ``gpuslate`` (the local
    parser a remote host runs) is the same line; and that argv, read here and written again, gives
    the same words: argv -> options -> remote argv -> options."""
    verb = VERBS[name]
    line = data.draw(_line(verb.line))
    argv = verb.command(line)
    back = verb.read(_parsed(argv))
    assert back == line, argv
    assert verb.command(back) == argv
    assert argv[0] == ("log" if getattr(getattr(line, "options", None), "old_name", False) else name)


def test_the_words_are_the_declared_flags_with_their_values():
    line = options.ClearLine(selection=options.Selection(gpus=(0, 2, 3), pids=(7, 9), user="-bob", match="--yes",
                                                         all_users=True),
                             options=options.ClearOptions(grace=5.0, max_used=1 << 20))
    assert verbs.CLEAR.command(line, sim="/s", yes=True) == [
        "clear", "--gpus=0,2-3", "--pid=7", "--pid=9", "--user=-bob", "--match=--yes", "--all-users", "--grace=5.0",
        "--max-used=1MiB", "--yes", "--json", "--sim=/s"]
    dry = line._replace(options=line.options._replace(dry_run=True))  # signals nothing: no consent to send
    assert verbs.CLEAR.command(dry, yes=True)[-3:] == ["--max-used=1MiB", "--dry-run", "--json"]
    assert verbs.PS.command(options.PsLine()) == ["ps", "--all", "--json"]  # the library lists every unit
    assert verbs.PS.read(_parsed(["ps"])).options == options.PsOptions(all=False)  # the command, without -a
    up = options.UpLine(names=("u",), options=options.UpOptions(clear_first=True), command=("serve", "--json", "--"))
    assert verbs.UP.command(up) == ["up", "u", "--clear", "--json", "--", "serve", "--json", "--"]


@pytest.mark.parametrize("name", sorted(VERBS))
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_consent_goes_with_the_line_that_needs_it(name, data):
    """Every verb that signals takes --yes (from its declaration, not its line); the consent given here is
    sent as --yes exactly where the line needs it, and the remote gpuslate reads it back."""
    verb = VERBS[name]
    line = data.draw(_line(verb.line))
    argv = verb.command(line, yes=True)
    assert ("--yes" in argv[:argv.index("--json")]) == verb.needs_consent(line)
    parsed = _parsed(argv)
    assert getattr(parsed, "yes", False) == verb.needs_consent(line)
    assert verb.read(parsed) == line
    assert ("--yes" in _option_strings(name)) == verb.signals


def _option_strings(word: str) -> set[str]:
    """Every option ``gpuslate WORD`` takes (its parser built from its declaration)."""
    import argparse

    sub = next(a for a in build_parser([word])._actions if isinstance(a, argparse._SubParsersAction))
    p = sub.choices[word]
    p.lazy_build(p)
    return {o for a in p._actions for o in a.option_strings}


def test_which_lines_need_consent():
    """clear always (but a dry run); the verbs that signal only the units they name never, but up --clear."""
    assert verbs.CLEAR.needs_consent(options.ClearLine())
    assert not verbs.CLEAR.needs_consent(options.ClearLine(options=options.ClearOptions(dry_run=True)))
    assert not verbs.DOWN.needs_consent(options.DownLine(names=("a",)))
    assert not verbs.DOWN.needs_consent(options.DownLine(options=options.DownOptions(clear_strays=True)))
    assert not verbs.SWAP.needs_consent(options.SwapLine(old="a", new="b"))
    assert not verbs.RESTART.needs_consent(options.RestartLine())
    assert not verbs.UP.needs_consent(options.UpLine(names=("a",)))
    assert verbs.UP.needs_consent(options.UpLine(names=("a",), options=options.UpOptions(clear_first=True)))
    assert not any(v.needs_consent(_bare(v.line)) for v in VERBS.values() if not v.signals)
    # a verb declared signals=True and not named (a new one): consent by its declaration alone
    new = verbs.Verb("new", options.PsLine, "x:y", summary="s", description="d", signals=True)
    assert new.needs_consent(options.PsLine()) and "--yes" in new.command(options.PsLine(), yes=True)


@pytest.mark.parametrize(("verb", "line", "why"), [
    (verbs.CLEAR, options.ClearLine(options=options.ClearOptions(confirm=lambda plan: True)), "confirmation"),
    (verbs.UP, options.UpLine(names=("u",), options=options.UpOptions(confirm=lambda plan: True)), "confirmation"),
    (verbs.SWAP, options.SwapLine(old="a", new="b", options=options.SwapOptions(prefetch_memory=1)), "prefetch"),
    (verbs.SWAP, options.SwapLine(old="a", new="b", options=options.SwapOptions(prefetch_timeout=5.0)), "prefetch"),
    (verbs.PS, options.PsLine(options=options.PsOptions(recent_s=1.0)), "recent_s"),
    (verbs.STATUS, options.StatusLine(watch=1.0), "--watch does not work"),
    (verbs.LOGS, options.LogsLine(names=("a",), follow=True), "--follow does not work"),
    (verbs.LOGS, options.LogsLine(names=("a",), options=options.LogsOptions(since=-1.0)), "since 1970"),
    (verbs.LOGS, options.LogsLine(names=("a",), options=options.LogsOptions(tail=-1)), "at least 0"),
    (verbs.AUDIT, options.AuditLine(options=options.AuditOptions(limit=-1)), "at least 0"),
    (verbs.CLEAR, options.ClearLine(options=options.ClearOptions(grace=math.nan)), "--grace nan"),
    (verbs.CLEAR, options.ClearLine(options=options.ClearOptions(grace=1e9)), "at most"),
    (verbs.DOWN, options.DownLine(names=("../x",)), "invalid unit name"),
    (verbs.UP, options.UpLine(names=("u",), unit=options.UnitFlags(env=("A=b", "=c"))), "KEY=VALUE"),
    (verbs.UP, options.UpLine(names=("u",), unit=options.UnitFlags(port=70000)), "1 to 65535"),
    (verbs.RESTART, options.RestartLine(config="--"), "'--' cannot be written"),
])
def test_what_cannot_be_sent_is_refused(verb, line, why):
    """A field that stays here (it says why, where it is declared), and a value the command's own parser
    would not read back as itself: refused with a UsageError before anything is sent."""
    with pytest.raises(UsageError, match=why):
        verb.command(line)


def test_a_value_of_two_dashes_is_refused_where_it_is_read(cli):
    """argparse drops a value of exactly ``--`` even in ``--config=--`` (the option then holds ``[]``, no
    text at all): read as a command line it is one clear line and exit 2, never a list taken for a path."""
    with pytest.raises(UsageError, match="'--' is not a value"):
        verbs.RESTART.read(_parsed(["restart", "--config=--"]))
    done = cli("restart", "--config=--")
    assert done.returncode == 2 and "'--' is not a value" in done.stderr, done
    assert "Traceback" not in done.stderr


def test_every_field_that_cannot_cross_says_why():
    for verb in VERBS.values():
        records = [verb.line] + [f.arg.record for f in verb.line._fields.values()
                                 if f.arg is not None and f.arg.form is Form.GROUP and f.arg.record]
        for cls in records:
            for name, f in cls._fields.items():
                assert f.arg is not None or f.why_here, f"{cls.__name__}.{name}: no flag, and no reason it stays here"
