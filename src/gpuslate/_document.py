"""Reading result documents back into result objects: every ``to_json`` has a ``from_json``.

The versioned ``--json`` document of a command is the contract between a remote
gpuslate and the local one (``--host``): the local side rebuilds the very result
type the command returns, and renders it with the same renderer as a local run.
``X.from_json(doc).to_json() == doc`` holds for every document gpuslate writes.

A document of another schema or version, or one that is malformed, raises
:class:`~gpuslate.errors.BadDocument`; nothing is guessed.

Every document that comes from outside (a peer over ssh or srun, an HTTP
answer, a file another user may write) is parsed by :func:`parse_json`, which
bounds what the standard parser does not: its size, its nesting (Python's
parser recurses once per level, so a document nested 200,000 deep is a
``RecursionError``), and numbers that no gpuslate document holds (more than
19 digits, ``NaN``, ``Infinity``, exponents of 100 and more: a 4,300-digit
integer costs a quadratic conversion, ``1e999`` is an infinity no renderer
expects). The checks run before the parser, at the C speed of ``re`` and
``str.replace``: a 16 MiB document is checked in tens of milliseconds.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .errors import BadDocument

#: the largest document read from a peer (a status of 64 GPUs with 2,000 holders is about 1 MB)
MAX_DOCUMENT_BYTES = 16 << 20
#: the deepest nesting of arrays and objects (gpuslate's own documents nest fewer than 10 levels)
MAX_DEPTH = 64

#: outside strings, every digit becomes 0, E becomes e, a '+' goes: a run of 20 zeros is a number of 20 digits
#: (more than any count of bytes or pid), "e000" an exponent of 100 or more (a negative one, "e-000", is a
#: tiny number, harmless)
_NUMBERS = str.maketrans("123456789E", "000000000e", "+")
#: 20 digits that start a number (not a fraction's: no '.' or digit before them)
_INTEGER_RUN = re.compile(r"(?<![0.])0{20}")
#: outside strings, everything but brackets goes (characters beyond ASCII stay: they are no JSON there)
_BRACKETS = str.maketrans({c: None for c in range(128) if chr(c) not in "[]{}"})


def parse_json(data: bytes | str, *, max_bytes: int = MAX_DOCUMENT_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON value of ``data`` (UTF-8 when bytes), or :class:`BadDocument` saying in one line why
    not: larger than ``max_bytes``, nested deeper than ``max_depth``, a number out of range, not
    UTF-8, not JSON. Never a ``RecursionError``, never more work than a few passes over the text."""
    if isinstance(data, bytes):
        if len(data) > max_bytes:
            raise BadDocument(f"a document of more than {max_bytes} bytes")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadDocument(f"not UTF-8 text (byte {exc.start})") from None
    else:  # text decoded losslessly (surrogateescape: an ssh run's) must still have been UTF-8
        try:
            size = len(data.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise BadDocument(f"not UTF-8 text (character {exc.start})") from None
        if size > max_bytes:
            raise BadDocument(f"a document of more than {max_bytes} bytes")
        text = data
    bare = _outside_strings(text)
    numbers = bare.translate(_NUMBERS)
    if _long_integer(numbers) or "e000" in numbers or "N" in bare or "I" in bare:  # NaN, Infinity
        raise BadDocument("not a gpuslate document: it holds a number out of range (20 digits or more, an "
                          "exponent of 100 or more, NaN or Infinity)")
    brackets = bare.translate(_BRACKETS)
    for _ in range(max_depth):  # each pass takes out the innermost pairs: one level of nesting
        if not brackets:
            break
        fewer = brackets.replace("[]", "").replace("{}", "") if len(brackets) > 1 else brackets
        if fewer == brackets:
            raise BadDocument("not JSON: its brackets do not match")
        brackets = fewer
    if brackets:
        if "[]" in brackets or "{}" in brackets:
            raise BadDocument(f"not a gpuslate document: nested deeper than {max_depth} levels")
        raise BadDocument("not JSON: its brackets do not match")
    try:
        return json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise BadDocument(f"not JSON: {exc}") from None


def _long_integer(numbers: str) -> bool:
    """Whether ``numbers`` (digits made 0) holds a run of 20 digits that is no fraction's (after a '.':
    ``0.00010936080128420515`` is a float's repr, harmless). The search runs only when there is a run."""
    return "0" * 20 in numbers and _INTEGER_RUN.search(numbers) is not None


def _outside_strings(text: str) -> str:
    """``text`` without its JSON strings (a valid document's; an invalid one's parse fails anyway)."""
    if "\\" in text:  # escaped backslashes first, then escaped quotes: what is left of '"' delimits strings
        text = text.replace("\\\\", "").replace('\\"', "")
    return "".join(text.split('"')[0::2])


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def checked(doc: object, schema: str) -> dict[str, Any]:
    """``doc`` when it is a ``schema`` document (name and version); else BadDocument."""
    if not isinstance(doc, dict):
        raise BadDocument(f"not a {schema} document: a JSON {type(doc).__name__}, not an object")
    found = doc.get("schema")
    if found != schema:
        raise BadDocument(f"not a {schema} document: its schema is {found!r}")
    return doc


@contextmanager
def reading(schema: str) -> Iterator[None]:
    """Turn a missing key or a value of the wrong type met while reading into one BadDocument."""
    try:
        yield
    except BadDocument:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise BadDocument(f"malformed {schema} document: {type(exc).__name__}: {exc}") from None

