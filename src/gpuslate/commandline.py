"""A record's command line (:mod:`gpuslate._record`): read from a parsed command line, written back as words.

    line = read(ClearLine, args)          # argparse's Namespace -> ClearLine(selection=..., options=...)
    words(line)                           # -> ["--gpus=0-1", "--grace=5.0", "--yes"]

``read`` and ``words`` are inverses over every command line argparse accepts: reading back the
words of a line gives the line again (tests/test_options.py walks every field of every verb through
both, and through argparse between them). That is what makes a remote command line safe to build
from a record rather than to pass along: another host gets exactly the options asked for here.

``words`` writes each option as ``--flag=VALUE`` (a value that starts with ``-`` stays a value),
leaves out what the command line means by default (the field's ``absent`` value), and refuses, with
a :class:`~gpuslate.errors.UsageError` before anything is sent, what a command line cannot carry:
a value its own parser would not read back as itself (a negative limit, a NaN grace, an ``--env``
key with ``=``, a value of exactly ``--``, which argparse drops), and a field that stays here (a
``confirm`` callback, ``--watch``) given a value.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

from ._record import Arg, Consent, Field, Form, Record
from .errors import UsageError

R = TypeVar("R", bound=Record)


def arguments(cls: type[Record]) -> Iterator[Field]:
    """Every field of ``cls`` that the command line has, its groups' fields in their place."""
    for f in cls._fields.values():
        if f.arg is None:
            continue
        if f.arg.form is Form.GROUP:
            assert f.arg.record is not None
            yield from arguments(f.arg.record)
        else:
            yield f


def read(cls: type[R], values: object) -> R:
    """The record ``values`` (a parsed command line: each field's value as the attribute of its
    name) gives; a field the command line has not, its default."""
    given: dict[str, Any] = {}
    for name, f in cls._fields.items():
        arg = f.arg
        if arg is None:
            continue
        if arg.form is Form.GROUP:
            assert arg.record is not None
            given[name] = read(arg.record, values)
            continue
        v = getattr(values, name, arg.absent)
        if arg.nargs is not None or arg.form is Form.REST:  # several values: a tuple of them, in order
            v = tuple(v) if v is not None else ()
        elif isinstance(v, list) and not v:  # argparse drops a value of exactly "--" (--config=--): []
            raise UsageError(f"{arg.long if arg.flags else arg.metavar}: '--' is not a value it takes")
        given[name] = v
    return cls(**given)


def words(record: Record, *, before_rest: Sequence[str] = ()) -> list[str]:
    """The command-line words that :func:`read` reads back as ``record``: positionals first, then
    the options, then ``before_rest`` (``--json``), then ``--`` and the rest, if any."""
    heads: list[str] = []
    flags: list[str] = []
    after: list[str] = []
    _write(record.validate(), heads, flags, after)
    return [*heads, *flags, *before_rest, *(["--", *after] if after else [])]


def _write(record: Record, heads: list[str], flags: list[str], after: list[str]) -> None:
    for name, f in type(record)._fields.items():
        value = getattr(record, name)
        arg = f.arg
        if arg is None:
            if f.why_here is not None and value != f.make_default():
                raise UsageError(f.why_here)
            continue
        if arg.form is Form.GROUP:
            _write(value.validate(), heads, flags, after)
            continue
        if arg.why_here is not None and value != arg.absent:
            raise UsageError(arg.why_here)
        if arg.form is Form.REST:
            after.extend(value)
        elif arg.form is Form.FLAG:
            if value == arg.set_to and value != arg.absent:
                flags.append(arg.long)
        elif arg.form is Form.POSITIONAL:
            heads.extend(_text(arg, v) for v in (value if arg.nargs is not None else (value,)))
        elif arg.form is Form.OPTION and value != arg.absent:
            items = value.items() if isinstance(value, dict) else value if arg.nargs is not None else (value,)
            flags.extend(f"{arg.long}={_text(arg, v)}" for v in items)


def _text(arg: Arg, value: Any) -> str:
    """``value`` as the text the field's parser reads back as ``value``; UsageError for one it cannot write."""
    shown = arg.show(value)
    if shown == "--":  # argparse reads it as the end of the options, even in --flag=--
        raise UsageError(f"{arg.long if arg.flags else arg.metavar} '--' cannot be written on a command line")
    if arg.parse is None:
        return shown
    back = arg.parse(shown)  # its own UsageError says what is wrong with the value
    if not _same(back, value):
        raise UsageError(f"{arg.long if arg.flags else arg.metavar} {value!r} cannot be written on a command line "
                         f"(it reads back as {back!r})")
    return shown


def _same(a: object, b: object) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return list(a) == list(b)
    return a == b


def alias_of(record: Record) -> str | None:
    """The old name the command runs under (``log`` for ``audit``), when a field of ``record`` asks for it."""
    for name, f in type(record)._fields.items():
        if f.arg is None:
            continue
        if f.arg.form is Form.GROUP:
            found = alias_of(getattr(record, name))
            if found is not None:
                return found
        elif f.arg.form is Form.ALIAS and getattr(record, name):
            return f.arg.flags[0]
    return None


def consent_marks(record: Record) -> set[Consent]:
    """The consent marks of the flags given in ``record`` (``--dry-run``: MOOT; ``up --clear``: WIDENS)."""
    found: set[Consent] = set()
    for name, f in type(record)._fields.items():
        if f.arg is None:
            continue
        value = getattr(record, name)
        if f.arg.form is Form.GROUP:
            found |= consent_marks(value)
        elif f.arg.consent is not None and f.arg.form is Form.FLAG and value == f.arg.set_to:
            found.add(f.arg.consent)
    return found


def consent_flags(cls: type[Record]) -> list[str]:
    """The flags of ``cls`` that widen what a verb signals (``--clear`` of ``up``)."""
    return [f.arg.long for f in arguments(cls) if f.arg is not None and f.arg.consent is Consent.WIDENS]
