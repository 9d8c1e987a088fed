"""Reading an engine's command line by the rules of the engine's own parser.

The engines parse their options with different libraries, and a command means
what *their* parser makes of it:

* **argparse** with its default ``allow_abbrev=True`` (SGLang's
  ``launch_server`` and ``sglang serve``; vLLM's ``FlexibleArgumentParser``,
  which keeps the default): a long option may be given by any unambiguous
  prefix (``--tp 8`` is SGLang's ``--tp-size 8``, ``--enable-dp-att`` its
  ``--enable-dp-attention``); a prefix that matches several option strings is
  an error, "ambiguous option: --x could match --a, --b" (CPython counts every
  option string, so two aliases of one option make a prefix of both
  ambiguous), and the server does not start. ``--name=value`` takes the prefix
  before ``=`` the same way. vLLM first turns ``_`` into ``-`` in an option's
  name (up to its first ``.``).
* **click** (TensorRT-LLM's ``trtllm-serve``): whole option names only; an
  abbreviation is "No such option" and the server does not start.

An :class:`OptionTable` lists the options gpuslate reads, and the engine's other
options that share their prefixes (so a prefix is resolved, or found ambiguous,
as the engine resolves it); :func:`scan` walks a command with it. An option the
table does not know is skipped: gpuslate reads only what it lists, and a prefix
the table cannot resolve is never taken for one of its options. A prefix that
is unique in the table but not among all of the engine's options makes the
engine refuse the command at startup, loudly; nothing gpuslate writes is
silently wrong for it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from functools import cached_property


class Style(str, enum.Enum):
    ARGPARSE = "argparse"  # unambiguous prefixes of long options are taken (allow_abbrev, argparse's default)
    EXACT = "exact"  # whole option names only (click; argparse with allow_abbrev=False)


@dataclass(frozen=True)
class OptionTable:
    """The options of an engine that gpuslate knows: each a tuple of its names (the first is the one
    gpuslate calls it by, the others its aliases), taking a value or not."""

    style: Style
    valued: tuple[tuple[str, ...], ...] = ()
    flags: tuple[tuple[str, ...], ...] = ()
    short: tuple[tuple[str, str], ...] = ()  # exact short options: ("-dp", "--data-parallel-size")
    underscores: bool = False  # --foo_bar is --foo-bar (vLLM's FlexibleArgumentParser)
    dotted: bool = False  # --json-arg.key VALUE sets one key of a JSON option (vLLM)

    @cached_property
    def _names(self) -> dict[str, tuple[str, bool]]:
        """option string -> (the option's first name, takes a value)"""
        out: dict[str, tuple[str, bool]] = {}
        for group, valued in ((self.valued, True), (self.flags, False)):
            for names in group:
                for n in names:
                    out[n] = (names[0], valued)
        return out

    def with_valued(self, name: str) -> OptionTable:
        """This table and one more valued option (a patched engine's own flag)."""
        if name in self._names:
            return self
        return replace(self, valued=(*self.valued, (name,)))

    def knows(self, name: str) -> bool:
        return name in self._names

    def normalize(self, name: str) -> str:
        """The option string as the engine's parser sees it (vLLM: ``_`` to ``-`` before any ``.``)."""
        if not self.underscores or not name.startswith("--"):
            return name
        head, dot, tail = name[2:].partition(".")
        return "--" + head.replace("_", "-") + dot + tail


@dataclass(frozen=True)
class Occurrence:
    """One option of the command, as the engine's parser takes it."""

    name: str  # the option's first name in the table
    written: str  # as the command wrote it (before any '=')
    value: str | None  # None: a flag, or a valued option at the end of the command
    span: tuple[int, int]  # the argv items it takes
    abbreviated: bool = False  # written as a prefix of one of its names (argparse took it)


@dataclass(frozen=True)
class Scan:
    """What :func:`scan` found: options, and what makes the engine refuse the command."""

    found: tuple[Occurrence, ...] = ()
    ambiguous: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (as written, the option strings it could match)
    refused: tuple[tuple[str, tuple[str, ...]], ...] = ()  # abbreviations a whole-name parser refuses
    dotted: tuple[str, ...] = ()  # vLLM's --json-arg.key forms, as written
    end: int = 0  # the index of a '--' that ends the options, or len(argv)

    def last(self, name: str) -> Occurrence | None:
        """The occurrence that counts (argparse and click: the last one given)."""
        for occ in reversed(self.found):
            if occ.name == name:
                return occ
        return None

    def has(self, name: str) -> bool:
        return self.last(name) is not None

    def value(self, name: str) -> str | None:
        occ = self.last(name)
        return occ.value if occ is not None else None

    def spans(self, *names: str) -> list[tuple[int, int]]:
        """Every span of these options (all occurrences: a rewritten command keeps none of them)."""
        return [o.span for o in self.found if o.name in names]

    def abbreviations(self) -> list[Occurrence]:
        return [o for o in self.found if o.abbreviated]


def scan(argv: tuple[str, ...] | list[str], start: int, table: OptionTable) -> Scan:
    """Walk ``argv[start:]`` (up to a ``--``) as the engine's parser does; see the module docstring."""
    names = table._names
    strings = sorted(names)
    found: list[Occurrence] = []
    ambiguous: list[tuple[str, tuple[str, ...]]] = []
    refused: list[tuple[str, tuple[str, ...]]] = []
    dotted: list[str] = []
    shorts = dict(table.short)
    i = start
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            break
        written, eq, val = arg.partition("=")
        if arg.startswith("-") and not arg.startswith("--") and written in shorts:
            name = shorts[written]
        elif arg.startswith("--") and len(arg) > 2:
            written = table.normalize(written)
            if table.dotted and "." in written:
                dotted.append(arg.partition("=")[0])
                i += 1 if eq else 2
                continue
            if written in names:
                name = written
            else:
                matches = tuple(s for s in strings if s.startswith(written))
                if not matches:
                    i += 1
                    continue
                if table.style is Style.EXACT:
                    refused.append((written, matches))
                    i += 1
                    continue
                if len(matches) > 1:
                    ambiguous.append((written, matches))
                    i += 1
                    continue
                name = matches[0]
        else:
            i += 1
            continue
        canonical, valued = names[name]
        abbrev = written not in names and name != shorts.get(written)
        if valued and not eq and i + 1 < len(argv):
            found.append(Occurrence(canonical, written, argv[i + 1], (i, i + 2), abbrev))
            i += 2
            continue
        found.append(Occurrence(canonical, written, val if eq else None, (i, i + 1), abbrev))
        i += 1
    return Scan(tuple(found), tuple(ambiguous), tuple(refused), tuple(dotted), min(i, len(argv)))


def int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def int_arg(s: Scan, name: str, default: int | None) -> int | None:
    """An integer option's value as the engine's parser takes it (ValueError as its parser says)."""
    value = s.value(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"argument {name}: invalid int value: {value!r}") from None


def port_arg(s: Scan, default: int) -> int:
    """``--port`` as the engine's parser takes it. 0 stays 0: the server binds ``(host, 0)``, which the
    kernel answers with a free port (vLLM's ``create_server_socket``, uvicorn's bind), so a test's
    server never collides with another on the default port."""
    value = int_arg(s, "--port", default)
    return default if value is None else value
