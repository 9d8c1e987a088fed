"""The one unit-name type: every command and the unit store take a name only as a :class:`UnitName`.

A unit's name becomes a file name in the state folder (``units/NAME.json``,
``units/logs/NAME.log``), a cgroup name and an environment marker, so a name
that is not checked can reach outside them: ``down ../../app/settings`` once
read ``settings.json`` as a corrupt record, signaled whatever listened on the
port it named and renamed it away. Checking the name once, in the type, rather
than in each command, leaves no command that forgets.
"""

from __future__ import annotations

import re

from .errors import UsageError

MAX_LENGTH = 64
#: ASCII letters and digits, then also '.', '_', '-': never '/', '..', NUL, a control
#: character, a space or a leading '-' (it would read as an option)
_NAME = rf"[A-Za-z0-9][A-Za-z0-9_.-]{{0,{MAX_LENGTH - 1}}}"  # compiled on first use (re caches it), not at import
RULE = f"1 to {MAX_LENGTH} ASCII letters, digits, '.', '_' or '-', starting with a letter or a digit"


class UnitName(str):
    """A checked unit name (a ``str``); ``UnitName(text)`` raises :class:`UsageError` for any other."""

    __slots__ = ()

    def __new__(cls, text: object) -> UnitName:
        if isinstance(text, UnitName):
            return text
        if not isinstance(text, str) or not re.fullmatch(_NAME, text):
            raise UsageError(f"invalid unit name {shown(text)}: {RULE}")
        return super().__new__(cls, text)


def is_unit_name(text: object) -> bool:
    return isinstance(text, str) and re.fullmatch(_NAME, text) is not None


def shown(text: object) -> str:
    """``text`` for a message: quoted and escaped (``repr``), cut to a sensible length."""
    if not isinstance(text, str):
        return type(text).__name__
    cut = text[:MAX_LENGTH + 16]
    return repr(cut) + ("..." if len(text) > len(cut) else "")
