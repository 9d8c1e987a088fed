"""Records: immutable values declared by their annotated fields and built by keywords only,
without ``dataclasses``; a field may also carry its command-line form.

    class WaitOptions(Record):
        max_used: int | None = option("--max-used", parse=parse_size, show=size_text, default=None,
                                      metavar="SIZE", help="most memory a free GPU may show")
        timeout: float = option("--timeout", parse=parse_seconds, default=60.0, metavar="DURATION",
                                help="give up after this long (default 60s)")

    class Launched(Record):
        spawned: int
        spawned_at: float = 0.0

The one record idiom. A record with a dozen fields built positionally lets two fields of one
type trade places unseen (``ClearResult``'s ``before`` and ``after``); a ``NamedTuple`` cannot
refuse positions, and ``@dataclass`` costs about 10 ms of imports (``inspect``, ``ast``...) at
every start of ``status`` and ``clear``, whose path imports neither. So a :class:`Record`
subclass is a plain slotted class: its metaclass turns the annotated fields into ``__slots__``
and a keyword-only ``__init__``; type checkers are told (``dataclass_transform``, PEP 681) that it
is a frozen, keyword-only dataclass, so mypy checks every construction (names, types, a missing
field) and every assignment as it would a dataclass's. What a NamedTuple gave its users stays:
equality, a hash, a ``repr``, ``_replace`` and ``_asdict``.

A field's default is a plain value (shared: give immutable ones), :func:`field` (a factory, or a
reason it cannot be sent to another host), or one of the command-line forms: :func:`option`,
:func:`options`, :func:`flag`, :func:`positional`, :func:`group`, :func:`rest`, :func:`alias`.
Each is written once, on the field: its flags, how its text is parsed and written back, its help
and its default. :mod:`gpuslate.commandline` reads a record from a parsed command line and writes
one back as words; ``cli/`` makes the argparse options from the same fields (verbs.py declares
every verb's).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform
else:
    def dataclass_transform(**_: Any) -> Callable[[type], type]:
        """PEP 681's marker: read by type checkers only, so at run time it changes nothing."""
        return lambda cls: cls

T = TypeVar("T")
V = TypeVar("V")
R = TypeVar("R", bound="Record")


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


#: no default: the field must be given
MISSING: Any = _Missing()


class Form(Enum):
    """How a field is written on a command line."""

    OPTION = "option"  # --flag=VALUE (one, or given again and again: Arg.nargs)
    FLAG = "flag"  # --flag alone: the field takes Arg.set_to
    POSITIONAL = "positional"  # VALUE (one, or several: Arg.nargs)
    GROUP = "group"  # a record of its own, whose fields are options of the same command line
    REST = "rest"  # every word after "--", verbatim (a server's command)
    ALIAS = "alias"  # True when the command is run by its old name (Arg.flags[0])


class Consent(Enum):
    """What a flag of a verb that signals does to the consent it needs (:meth:`gpuslate.verbs.Verb.needs_consent`)."""

    MOOT = "moot"  # given, the command signals nothing (--dry-run): nothing to consent to
    WIDENS = "widens"  # given, it signals processes the command line does not name (up --clear: clear's plan)


class Arg:
    """A field's command-line form: what argparse is told, and how a value is written back.

    ``show`` writes a value as the text ``parse`` reads back to the same value (the remote command
    line is made with it, and :func:`gpuslate.commandline.words` checks that it does); ``nargs``:
    several values (a positional's argparse ``nargs``; an option given again and again); ``absent``
    is the value the command line means when the field is not on it (the field's default, unless
    the library's default differs from the command's: ``ps`` lists every unit, ``gpuslate ps``
    only those without ``-a``)."""

    __slots__ = ("absent", "choices", "consent", "const", "flags", "form", "help", "metavar", "nargs", "parse",
                 "record", "required", "set_to", "show", "why_here")

    def __init__(self, form: Form, flags: tuple[str, ...] = (), *, parse: Callable[[str], Any] | None = None,
                 show: Callable[[Any], str] = str, help: str | None = None, metavar: str | None = None,
                 choices: Sequence[str] | str | None = None, nargs: str | None = None,
                 set_to: Any = True, const: Any = MISSING, required: bool = False, absent: Any = MISSING,
                 record: type[Record] | None = None, why_here: str | None = None,
                 consent: Consent | None = None) -> None:
        self.form, self.flags, self.parse, self.show, self.help = form, flags, parse, show, help
        self.metavar, self.nargs, self.set_to, self.const = metavar, nargs, set_to, const
        self.required, self.absent, self.record = required, absent, record
        #: the values argparse allows: a tuple, or ``"module:attr"`` naming one (the engines' names live
        #: with the engines, above this layer: the command line imports them when it builds the option)
        self.choices = choices
        #: why a value other than ``absent`` cannot be sent to another host (``--watch``: it runs until Ctrl-C)
        self.why_here = why_here
        #: a flag that, given, makes a signalling verb need no consent (MOOT: --dry-run) or need it (WIDENS)
        self.consent = consent

    @property
    def long(self) -> str:
        """The flag a command line is written with: the first long one (``--all`` for ``-a, --all``);
        a positional's metavar."""
        return next((f for f in self.flags if f.startswith("--")), self.flags[0] if self.flags else self.metavar or "")


class Field:
    """One field of a record: its name, its default (or a factory of it), its command-line form."""

    __slots__ = ("arg", "default", "factory", "name", "why_here")

    def __init__(self, default: Any = MISSING, factory: Callable[[], Any] | None = None, arg: Arg | None = None,
                 why_here: str | None = None) -> None:
        self.name = ""
        self.default, self.factory, self.arg = default, factory, arg
        #: a field without a command-line form: why a value other than its default cannot be sent
        #: to another host (a callback; a bound the command takes from the host it runs on)
        self.why_here = why_here

    def make_default(self) -> Any:
        if self.factory is not None:
            return self.factory()
        return self.default


# -- field specifiers: a default, and what the command line says (each typed as the field's value) --


def field(*, default: Any = MISSING, default_factory: Callable[[], Any] | None = None,
          why_here: str | None = None) -> Any:
    """A field with a factory for its default (a fresh list each time), or one that cannot be sent
    to another host, ``why_here`` saying why (refused there unless it has its default)."""
    return Field(default, default_factory, None, why_here)


def option(*flags: str, parse: Callable[[str], V], default: T, help: str, metavar: str | None = None,
           show: Callable[[V], str] = str, choices: Sequence[str] | str | None = None,
           const: V = MISSING, absent: V | T = MISSING, why_here: str | None = None) -> V | T:
    """``--flag VALUE``, read by ``parse`` (a :class:`~gpuslate.errors.UsageError` for bad text) and
    written back by ``show``; the field is ``default`` when it is not given (None, often, where
    ``parse`` never gives None). ``const``: the value of the flag given without one (``--watch``)."""
    return Field(default, None, Arg(  # type: ignore[return-value]  # a Field, typed as the field's value
        Form.OPTION, flags, parse=parse, show=show, help=help, metavar=metavar, choices=choices, const=const,
        absent=default if absent is MISSING else absent, why_here=why_here))


def options(*flags: str, parse: Callable[[str], T], help: str, metavar: str,
            show: Callable[[T], str] = str) -> tuple[T, ...]:
    """``--flag VALUE``, repeatable: every value, in order (none: ``()``)."""
    return Field((), None, Arg(Form.OPTION, flags, parse=parse, show=show, help=help, metavar=metavar, nargs="*",
                               absent=()))  # type: ignore[return-value]  # a Field, typed as the field's value


def flag(*flags: str, help: str, default: Any = False, set_to: Any = True, required: bool = False,
         why_here: str | None = None, consent: Consent | None = None) -> Any:
    """``--flag`` alone: the field is ``set_to`` when it is given (``--no-prefetch``: False), else
    what the command means without it, ``not set_to`` (``default`` when that is no bool: ``--smoke``
    not given leaves the unit's own setting, None). ``default``: the library's default, which may
    differ (``PsOptions.all`` is True; ``ps`` without ``-a`` is False). ``consent``: what giving it does
    to the consent a verb that signals needs (``--dry-run``: none needed; ``up --clear``: needed)."""
    absent = default if not isinstance(default, bool) else not set_to
    return Field(default, None, Arg(Form.FLAG, flags, help=help, set_to=set_to, required=required, absent=absent,
                                    why_here=why_here, consent=consent))


def positional(metavar: str, *, parse: Callable[[str], T], help: str | None = None, nargs: str | None = None,
               default: Any = MISSING, show: Callable[[T], str] = str) -> Any:
    """An argument without a flag: one (``nargs`` None), or several as a tuple (``"*"``, ``"+"``;
    give ``default=()``, as type checkers read a default only where it is written)."""
    return Field(default, None, Arg(Form.POSITIONAL, (), parse=parse, show=show, help=help, metavar=metavar,
                                    nargs=nargs, absent=default))


def group(record: type[R]) -> R:
    """A record whose fields are options of the same command line (``clear``'s ``ClearOptions``)."""
    return Field(MISSING, record, Arg(Form.GROUP, record=record))  # type: ignore[return-value]


def rest(*, help: str) -> tuple[str, ...]:
    """Every word after the first ``--``, verbatim: a server's command line."""
    return Field((), None, Arg(Form.REST, help=help, absent=()))  # type: ignore[return-value]


def alias(word: str, *, help: str) -> bool:
    """True when the command runs under its old name ``word`` (``log`` for ``audit``)."""
    return Field(False, None, Arg(Form.ALIAS, (word,), help=help, absent=False))  # type: ignore[return-value]


class _RecordType(type):
    """Makes a record class from its annotated fields: ``__slots__``, and ``_fields`` (name -> Field)."""

    def __new__(mcs, name: str, bases: tuple[type, ...], ns: dict[str, Any]) -> _RecordType:
        fields: dict[str, Field] = {}
        for base in reversed(bases):
            fields.update(getattr(base, "_fields", {}))
        own = [n for n, note in ns.get("__annotations__", {}).items() if not _is_classvar(note)]
        for n in own:
            value = ns.pop(n, MISSING)
            f = value if isinstance(value, Field) else Field(default=value)
            f.name = n
            fields[n] = f
        ns["__slots__"] = tuple(own)
        ns["_fields"] = fields
        return super().__new__(mcs, name, bases, ns)


def _is_classvar(note: object) -> bool:
    text = note if isinstance(note, str) else getattr(note, "__name__", "")  # annotations are text here
    return isinstance(text, str) and text.startswith(("ClassVar", "typing.ClassVar"))


# Type checkers are told of the specifiers that may leave a field without a default; the others
# (flag, options, group, rest, alias) always give one, which a checker then reads as the default value.
@dataclass_transform(kw_only_default=True, frozen_default=True, field_specifiers=(field, option, positional))
class Record(metaclass=_RecordType):
    """Base of a record: annotate the fields (see the module docstring); build by keywords."""

    __slots__ = ()
    _fields: ClassVar[dict[str, Field]]

    if not TYPE_CHECKING:  # to a type checker, the dataclass __init__ made from the fields
        def __init__(self, **values: Any) -> None:
            for name, f in type(self)._fields.items():
                v = values.pop(name, MISSING)
                if v is MISSING:
                    v = f.make_default()
                    if v is MISSING:
                        raise TypeError(f"{type(self).__name__}() missing keyword argument {name!r}")
                object.__setattr__(self, name, v)
            if values:
                raise TypeError(f"{type(self).__name__}() got unexpected keyword arguments: {', '.join(values)}")

    def validate(self: R) -> R:
        """The record itself, or :class:`~gpuslate.errors.UsageError` for a value nothing can act on
        (a record whose fields have bounds says which): checked before it is used, here or sent."""
        return self

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable: use _replace({name}=...)")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def _asdict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in type(self)._fields}

    def _replace(self: R, **changes: Any) -> R:
        return type(self)(**{**self._asdict(), **changes})

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in type(self)._fields)

    def __hash__(self) -> int:  # as a NamedTuple's: a TypeError for an unhashable field's value
        return hash((type(self), *(getattr(self, n) for n in type(self)._fields)))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{n}={getattr(self, n)!r}' for n in type(self)._fields)})"

    def __reduce__(self) -> tuple[Any, ...]:  # copy and pickle build it by keywords, as everyone does
        return (_rebuild, (type(self), self._asdict()))


def _rebuild(cls: type[R], values: dict[str, Any]) -> R:
    return cls(**values)
