"""Reading result documents back into result objects: every ``to_json`` has a ``from_json``.

The versioned ``--json`` document of a command is the contract between a remote
gpuslate and the local one (``--host``): the local side rebuilds the very result
type the command returns, and renders it with the same renderer as a local run.
``X.from_json(doc).to_json() == doc`` holds for every document gpuslate writes.

A document of another schema or version, or one that is malformed, raises
:class:`~gpuslate.errors.BadDocument`; nothing is guessed. Every field of every
record is read by its type and range where the record is parsed, in its
``from_json`` (:class:`Fields`): a size is a whole number from 0, a pid one from
1, a GPU index one from 0 to 1023, a time an ISO-8601 string, a status one of its
enum's values; ``"used": "12"`` or ``-5`` or ``1.5`` is the host's bad document
(naming the field, ``gpus[0].memory.used``), never a traceback further on nor a
negative size on a screen.

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
import math
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import Enum
from typing import Any, TypeVar

from ._time import parse_iso_time
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
    except Malformed as exc:
        raise BadDocument(f"malformed {schema} document: {exc}") from None
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise BadDocument(f"malformed {schema} document: {type(exc).__name__}: {exc}") from None


class Malformed(ValueError):
    """A field of a document that is missing, of the wrong type or out of range; its message starts
    with the field's path (``gpus[0].processes[1].used_memory: expected ...``)."""


T = TypeVar("T")
E = TypeVar("E", bound=Enum)
_MISSING: Any = object()
#: the ranges fields are held to: a count of bytes (1 EiB: more than any GPU or file), a pid, a uid, a GPU
MAX_BYTES = 1 << 60
MAX_PID = (1 << 31) - 1
MAX_ID = (1 << 32) - 1
MAX_GPU = 1023
#: a duration or a time in seconds (epoch seconds up to the year 5138: bounded, finite)
MAX_SECONDS = 1e11


def _shown(v: object) -> str:
    text = json.dumps(v) if isinstance(v, (str, int, float, bool, type(None))) else f"a JSON {type(v).__name__}"
    return text if len(text) <= 40 else text[:37] + "..."


def _path(key: str, exc: Exception) -> Malformed:
    """``exc`` (met in ``key``'s value) as a :class:`Malformed` that names ``key`` first."""
    inner = str(exc) if isinstance(exc, Malformed) else f"{type(exc).__name__}: {exc}"
    sep = "" if inner.startswith("[") else ": " if inner.startswith("expected") else "."
    return Malformed(f"{key}{sep}{inner}")


def _bad(want: str, v: object) -> Malformed:
    return Malformed(f"expected {want}, got {_shown(v)}")


def _range(low: float | None, high: float | None) -> str:
    def shown(x: float) -> str:
        return str(x) if isinstance(x, int) else f"{x:g}"
    return (f" from {shown(low)}" if low is not None else "") + (f" to {shown(high)}" if high is not None else "")


def whole(v: object, low: int | None = None, high: int | None = None, what: str = "a whole number") -> int:
    """``v`` when it is a whole number (never a bool, never 1.5 or "12") within the bounds; else Malformed."""
    if isinstance(v, bool) or not isinstance(v, int) or (low is not None and v < low) or \
            (high is not None and v > high):
        raise _bad(what + _range(low, high), v)
    return v


def real(v: object, low: float | None = None, high: float | None = None) -> float:
    """``v`` as a float when it is a finite number within the bounds (never a bool or a string); else Malformed."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v in (math.inf, -math.inf) or \
            (low is not None and v < low) or (high is not None and v > high):
        raise _bad("a number" + _range(low, high), v)
    return float(v)


def string(v: object) -> str:
    if not isinstance(v, str):
        raise _bad("a string", v)
    return v


class Fields:
    """One record of a document, read field by field, each by its type and range (module doc).

    ``f = Fields(d)`` raises :class:`Malformed` unless ``d`` is an object; each reader raises it for a
    field that is missing (unless a ``default`` is given: a field a newer version added, whose default
    is returned as it is), of another type, or out of range. Nested records and lists say where
    (:meth:`items`, :meth:`record`)."""

    __slots__ = ("d",)

    def __init__(self, d: object) -> None:
        if not isinstance(d, dict):
            raise _bad("an object", d)
        self.d: dict[str, Any] = d

    def has(self, key: str) -> bool:
        return key in self.d

    def raw(self, key: str, default: Any = _MISSING) -> Any:
        """The value as it is (for a field its caller checks itself)."""
        v = self.d.get(key, _MISSING)
        if v is _MISSING:
            if default is _MISSING:
                raise Malformed(f"{key}: missing")
            return default
        return v

    def read(self, key: str, check: Callable[[Any], T], default: Any = _MISSING, *, optional: bool = False) -> Any:
        """The value of ``key`` through ``check`` (one of this module's, raising Malformed), named on failure;
        ``default`` when absent (unchecked); ``optional``: ``null`` is ``None``."""
        v = self.d.get(key, _MISSING)
        if v is _MISSING:
            if default is _MISSING:
                raise Malformed(f"{key}: missing")
            return default
        if optional and v is None:
            return None
        try:
            return check(v)
        except (Malformed, KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            raise _path(key, exc) from None

    # the readers a status of 2,000 holders calls 20,000 times: the usual value passes one type test
    def integer(self, key: str, low: int | None = None, high: int | None = None, *, default: Any = _MISSING,
                what: str = "a whole number") -> int:
        v = self.d.get(key, _MISSING)
        if type(v) is int and (low is None or v >= low) and (high is None or v <= high):
            return v
        return self.read(key, lambda x: whole(x, low, high, what), default)

    def opt_integer(self, key: str, low: int | None = None, high: int | None = None, *, default: Any = _MISSING,
                    what: str = "a whole number") -> int | None:
        v = self.d.get(key, _MISSING)
        if v is None or (type(v) is int and (low is None or v >= low) and (high is None or v <= high)):
            return v
        return self.read(key, lambda x: whole(x, low, high, what), default, optional=True)

    def size(self, key: str, *, default: Any = _MISSING) -> int:
        return self.integer(key, 0, MAX_BYTES, default=default, what="a size in bytes")

    def opt_size(self, key: str, *, default: Any = _MISSING) -> int | None:
        return self.opt_integer(key, 0, MAX_BYTES, default=default, what="a size in bytes")

    def pid(self, key: str, *, default: Any = _MISSING) -> int:
        return self.integer(key, 1, MAX_PID, default=default, what="a process id")

    def opt_pid(self, key: str, *, default: Any = _MISSING) -> int | None:
        return self.opt_integer(key, 1, MAX_PID, default=default, what="a process id")

    def pids(self, key: str, *, default: Any = _MISSING) -> list[int]:
        return self.ints(key, 1, MAX_PID, default=default, what="a process id")

    def gpu(self, key: str) -> int:
        return self.integer(key, 0, MAX_GPU, what="a GPU index")

    def gpus(self, key: str, *, default: Any = _MISSING) -> list[int]:
        return self.ints(key, 0, MAX_GPU, default=default, what="a GPU index")

    def number(self, key: str, low: float | None = None, high: float | None = None, *,
               default: Any = _MISSING) -> float:
        return self.read(key, lambda v: real(v, low, high), default)

    def opt_number(self, key: str, low: float | None = None, high: float | None = None, *,
                   default: Any = _MISSING) -> float | None:
        return self.read(key, lambda v: real(v, low, high), default, optional=True)

    def seconds(self, key: str, *, default: Any = _MISSING) -> float:
        """A duration or an epoch time in seconds: from 0, finite."""
        return self.number(key, 0.0, MAX_SECONDS, default=default)

    def opt_seconds(self, key: str, *, default: Any = _MISSING) -> float | None:
        return self.opt_number(key, 0.0, MAX_SECONDS, default=default)

    def timings(self, key: str, *, default: Any = _MISSING) -> dict[str, float]:
        """An object of durations in seconds (``{"stop_s": 0.2, ...}``)."""
        def check(v: Any) -> dict[str, float]:
            f = Fields(v)
            return {str(k): f.seconds(k) for k in f.d}
        return self.read(key, check, default)

    def text(self, key: str, *, default: Any = _MISSING) -> str:
        v = self.d.get(key, _MISSING)
        if type(v) is str:
            return v
        return self.read(key, string, default)

    def opt_text(self, key: str, *, default: Any = _MISSING) -> str | None:
        v = self.d.get(key, _MISSING)
        if v is None or type(v) is str:
            return v
        return self.read(key, string, default, optional=True)

    def flag(self, key: str, *, default: Any = _MISSING) -> bool:
        v = self.d.get(key, _MISSING)
        if v is True or v is False:
            return v

        def check(v: Any) -> bool:
            if not isinstance(v, bool):
                raise _bad("true or false", v)
            return v
        return self.read(key, check, default)

    def choice(self, key: str, enum: type[E], *, default: Any = _MISSING) -> E:
        def check(v: Any) -> E:
            try:
                return enum(v)
            except (ValueError, TypeError):
                raise _bad("one of " + ", ".join(str(m.value) for m in enum), v) from None
        return self.read(key, check, default)

    def time(self, key: str) -> float:
        """An ISO-8601 time (``2026-01-02T03:04:05.678Z``) as epoch seconds."""
        return self.read(key, iso)

    def opt_time(self, key: str, *, default: Any = _MISSING) -> float | None:
        return self.read(key, iso, default, optional=True)

    def items(self, key: str, read: Callable[[Any], T], *, default: Any = _MISSING) -> list[T]:
        """A list, each item read by ``read`` (a record's ``from_json``); a bad item is named by index."""
        def check(v: Any) -> list[T]:
            if not isinstance(v, list):
                raise _bad("a list", v)
            out: list[T] = []
            for i, item in enumerate(v):
                try:
                    out.append(read(item))
                except (Malformed, KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
                    raise _path(f"[{i}]", exc) from None
            return out
        return self.read(key, check, default)

    def ints(self, key: str, low: int | None = None, high: int | None = None, *, default: Any = _MISSING,
             what: str = "a whole number") -> list[int]:
        return self.items(key, lambda v: whole(v, low, high, what), default=default)

    def texts(self, key: str, *, default: Any = _MISSING) -> list[str]:
        return self.items(key, string, default=default)

    def record(self, key: str, read: Callable[[Any], T], *, default: Any = _MISSING) -> T:
        """A nested record, read by ``read``; a bad field in it is named under ``key``."""
        return self.read(key, read, default)

    def opt_record(self, key: str, read: Callable[[Any], T], *, default: Any = _MISSING) -> T | None:
        return self.read(key, read, default, optional=True)

    def mapping(self, key: str, *, default: Any = _MISSING) -> dict[str, Any]:
        """An object, kept as it is (free-form: a spec's environment, a server's answer)."""
        def check(v: Any) -> dict[str, Any]:
            if not isinstance(v, dict):
                raise _bad("an object", v)
            return v
        return self.read(key, check, default)


def iso(v: object) -> float:
    """An ISO-8601 time string as epoch seconds; else Malformed."""
    text = string(v)
    epoch = parse_iso_time(text)  # 0.0 for what does not read
    if (epoch == 0.0 and not text.startswith("1970-01-01T00:00:00")) or not 0.0 <= epoch <= MAX_SECONDS:
        raise _bad("an ISO-8601 time (from 1970 to 5138)", v)
    return epoch
