"""TOML files (gpuslate.toml, experiment specs): reading them, and where things are in them.

``tomllib`` parses without positions, so a value rejected after parsing is
found again in the text for a FILE:LINE message: best effort, and 1 when unsure.

``tomllib`` also recurses once per nested array or inline table (a deep file is
a RecursionError) and takes quadratic time in a key's dotted parts (a 50,000-part
key takes a minute). A configuration file needs neither, so the text is bounded
before it is parsed (:func:`check_bounds`, one linear pass): its size, its
nesting and its keys' parts, each refused with FILE:LINE.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

from ._walk import read_file
from .errors import FileTooLarge, PermissionDenied, UsageError

#: no configuration or experiment spec comes near these; anything beyond is refused before parsing
MAX_BYTES = 1 << 20
MAX_NESTING = 32  # arrays and inline tables inside one another (a table header counts 1 or 2)
MAX_KEY_PARTS = 32  # dotted parts of one key or table name
_OPEN, _CLOSE = "[{", "]}"


def read_toml(path: str | os.PathLike[str], what: str) -> tuple[str, dict[str, Any]]:
    """(text, document) of a TOML file; a UsageError naming ``what`` when it is missing,
    unreadable or malformed (tomllib's message already says the line and column)."""
    if sys.version_info >= (3, 11):  # imported here: only the commands that read a file pay for it
        import tomllib  # lazy: startup
    else:
        import tomli as tomllib  # lazy: optional
    try:  # the walk: a regular file only (a FIFO never hangs the read), never another user's link, bounded
        data = read_file(path, limit=MAX_BYTES, what=what)
    except FileNotFoundError:
        raise UsageError(f"{what} {path} not found") from None
    except FileTooLarge:
        raise UsageError(f"{path}: too large for a {what} (more than {MAX_BYTES >> 20} MiB)") from None
    except PermissionDenied as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None
    problem = check_bounds(text)
    if problem is not None:
        line, why = problem
        raise UsageError(f"{path}:{line}: malformed TOML: {why}")
    try:
        return text, tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: malformed TOML: {exc}") from None
    except RecursionError:  # not reached within the bounds above; never a traceback all the same
        raise UsageError(f"{path}: malformed TOML: nested too deeply") from None


def check_bounds(text: str) -> tuple[int, str] | None:
    """(line, why) of the first place ``text`` nests deeper than :data:`MAX_NESTING` or
    has a key of more than :data:`MAX_KEY_PARTS` parts; ``None`` when within bounds.

    One pass that skips strings (all four kinds) and comments. A run of dots between
    structural characters (``= , [ ] { }``, a newline) counts as one key's parts: a
    float or a time has one dot, so values never reach the bound.
    """
    depth = dots = 0
    line = 1
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            dots = 0
        elif c == "#":
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        elif c in "\"'":
            quote = text[i:i + 3] if text[i:i + 3] in ('"""', "'''") else c
            j = i + len(quote)
            while True:
                end = text.find(quote, j)
                if end < 0:
                    return None  # unterminated: tomllib says where
                if quote[0] == '"' and _escaped(text, end):
                    j = end + 1
                    continue
                break
            if len(quote) == 3:
                for _ in range(2):  # up to two quotes may end the content: '''a''''' is "a''"
                    if text[end + 3:end + 4] != c:
                        break
                    end += 1
                line += text.count("\n", i, end)
            elif "\n" in text[i:end]:
                return None  # a newline in a one-line string: tomllib says where
            i = end + len(quote)
            continue
        elif c in _OPEN:
            depth += 1
            dots = 0
            if depth > MAX_NESTING:
                return line, f"arrays or inline tables nested deeper than {MAX_NESTING} levels"
        elif c in _CLOSE:
            depth = max(depth - 1, 0)
            dots = 0
        elif c in "=,":
            dots = 0
        elif c == ".":
            dots += 1
            if dots >= MAX_KEY_PARTS:
                return line, f"a key of more than {MAX_KEY_PARTS} dotted parts"
        i += 1
    return None


def _escaped(text: str, at: int) -> bool:
    """Whether the quote at ``at`` is escaped (an odd number of backslashes before it)."""
    k = at - 1
    while k >= 0 and text[k] == "\\":
        k -= 1
    return (at - 1 - k) % 2 == 1


def line_of(text: str, table: str | None, key: str | None) -> int:
    """Line (1-based) of ``key`` in ``[table]`` (or of the table's header, or of a top-level key); 1 if unsure."""
    lines = text.splitlines()
    start = -1
    if table is not None:
        want = _norm(table)
        start = next((i for i, ln in enumerate(lines)
                      if ln.lstrip().startswith("[") and _norm(ln.strip().split("#")[0]) == want), -1)
        if start < 0:
            # an inline table or dotted key at top level: `table = {...}` / `table.key = ...`
            return line_of(text, None, table.split(".")[0])
        if key is None:
            return start + 1
    pat = re.compile(r"\s*[\"']?" + re.escape(key or "") + r"[\"']?\s*[=.]")
    for i in range(start + 1, len(lines)):
        if lines[i].lstrip().startswith("["):
            if table is not None:
                break
            continue
        if pat.match(lines[i]):
            return i + 1
    if table is None and key is not None:  # a top-level table header `[key]` or `[key.x]`
        hdr = re.compile(r"\s*\[+\s*[\"']?" + re.escape(key) + r"[\"']?\s*[\].]")
        return next((i + 1 for i, ln in enumerate(lines) if hdr.match(ln)), 1)
    return max(start + 1, 1)


def _norm(header: str) -> str:
    return re.sub(r"[\s\"'\[\]]", "", header)
