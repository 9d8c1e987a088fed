"""Parsing and formatting of the values users type: GPU lists, sizes, seconds, addresses and URLs.

Every parser accepts ASCII digits only (``\\d`` would take full-width and other
Unicode digits, which ``int()`` then accepts too) and bounds what it returns, so
that no input can make gpuslate build a huge list, overflow a float or hang.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from .errors import UsageError

#: the highest GPU index accepted: far above any host, low enough that a range is cheap
MAX_GPU_INDEX = 1023
#: ``--gpus all``, docker's spelling: every GPU of the host
ALL_GPUS = "all"
#: the largest size accepted (1 EiB): above any GPU, far below float and int overflow
MAX_SIZE = 1024**6
#: the longest duration accepted (about 115 days): longer ones overflow sleep() and friends
MAX_SECONDS = 1e7

# compiled on first use (re caches it), not at import: most commands never parse a size
_SIZE_PATTERN = r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]{0,3})\s*"
#: every unit a size takes, lower-cased: binary all of them, as docker's ``-m 40g`` (go-units' RAMInBytes:
#: k, m, g, t with an optional i and b, any case); a bare number is no size (see :func:`parse_size`)
_UNITS = {"b": 1, **{f"{p}{i}{b}": 1024 ** (n + 1) for n, p in enumerate("kmgt") for i in ("", "i") for b in ("", "b")}}
#: how a size is written back (:func:`size_text`), largest unit first
_SIZE_NAMES = (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024))
SIZE_HELP = "40GiB, 512MiB or 40G (binary, as docker's -m: G, GB and GiB are all 2**30 bytes)"


def parse_size(text: str | int) -> int:
    """Bytes of ``"40GiB"``, ``"40G"``, ``"40g"``, ``"40GB"`` (every unit binary, as docker's ``-m``:
    a GPU maker's "80GB" is about 80 GiB too), ``"512MiB"``, ``"1.5GiB"``, ``"4096B"`` or ``"0"``.

    A bare number other than 0 is refused, with what to write: ``--memory 40`` held 40 bytes, and
    ``40G`` read as 10**9 bytes held 37.3 GiB, both silently. A library caller's int is bytes."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise UsageError(f"invalid size {text!r}: must not be negative")
        value = text
    else:
        shown = _shown(text)
        m = re.fullmatch(_SIZE_PATTERN, str(text), re.ASCII)
        unit = m.group(2).lower() if m else ""
        if not m or (unit and unit not in _UNITS):
            raise UsageError(f"invalid size {shown}: expected a number and a unit, e.g. {SIZE_HELP}")
        digits = m.group(1)
        if not unit:
            if float(digits) != 0:
                n = digits if len(digits) <= 12 else "40"
                raise UsageError(f"invalid size {shown}: give its unit, e.g. {n}GiB or {n}MiB ({n}B for bytes)")
            return 0
        # a whole number exactly (a float is exact to 2**53 only); one of 400 digits is inf, caught below
        number = int(digits) * _UNITS[unit] if "." not in digits and len(digits) <= 24 else \
            float(digits) * _UNITS[unit]
        if not number <= MAX_SIZE:
            raise UsageError(f"invalid size {shown}: at most 1 EiB")
        value = round(number)
    if value > MAX_SIZE:
        raise UsageError(f"invalid size {_shown(text)}: at most 1 EiB")
    return value


def size_text(value: int) -> str:
    """A byte count as :func:`parse_size` reads it back exactly: the largest binary unit it is a whole
    number of (``40GiB``, ``1536MiB``), else bytes (``1000B``); ``0`` alone."""
    if value == 0:
        return "0"
    for name, unit in _SIZE_NAMES:
        if value % unit == 0:
            return f"{value // unit}{name}"
    return f"{value}B"


def _shown(text: object, limit: int = 40) -> str:
    """``repr`` of a user's value, cut: a 400-digit number makes no readable error line."""
    r = repr(text)
    return r if len(r) <= limit else r[: limit - 4] + "...'"


#: the units of a duration, as Go's time.ParseDuration (docker's --since, compose's healthcheck intervals)
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
DURATION_HELP = "seconds (90), or with units: 90s, 1m30s, 500ms, 2h"


def parse_duration(text: str) -> float | None:
    """Seconds of a duration with units, Go's syntax (``42m``, ``1h30m``, ``1.5h``, ``300ms``); None
    for text that is no such duration (a bare number is not: see :func:`parse_seconds`)."""
    s = text.strip()
    if len(s) > 64:
        return None
    parts = re.findall(rf"({_NUMBER})(ns|us|µs|ms|s|m|h)", s)
    if not parts or "".join(n + u for n, u in parts) != s:
        return None
    return sum(float(n) * _DURATION_UNITS[u] for n, u in parts)


def parse_seconds(text: str | float, *, allow_zero: bool = True, what: str = "duration") -> float:
    """A duration in seconds, 0 (or more than 0) up to :data:`MAX_SECONDS`: a number of seconds
    (``90``, ``1.5``, ``1e-05``) or a duration with units (``90s``, ``1m30s``, ``500ms``, ``2h``:
    :func:`parse_duration`); a number (a unit file's ``grace = 10``) is seconds."""
    if isinstance(text, bool):
        raise UsageError(f"invalid {what} {_shown(text)}: expected {DURATION_HELP}")
    if isinstance(text, (int, float)):
        v = float(text)
    else:
        s = str(text).strip()
        if re.fullmatch(rf"[-+]?{_NUMBER}(?:[eE][-+]?[0-9]+)?", s, re.ASCII):  # a sign: told its bound
            v = float(s)
        else:
            found = parse_duration(s)
            if found is None:
                raise UsageError(f"invalid {what} {_shown(text)}: expected {DURATION_HELP}")
            v = found
    low_ok = v >= 0 if allow_zero else v > 0
    if not (low_ok and math.isfinite(v)):
        bound = "at least 0" if allow_zero else "greater than 0"
        raise UsageError(f"invalid {what} {_shown(text)}: must be {bound}")
    if v > MAX_SECONDS:
        raise UsageError(f"invalid {what} {_shown(text)}: at most {MAX_SECONDS:.0f} seconds")
    return v


def check_seconds(label: str, value: float | None) -> None:
    """An option object's duration: None (unset) or at least 0; NaN is refused too.
    ``label`` names it as the user gave it (``--grace``, ``prefetch timeout``)."""
    if value is not None and not value >= 0:
        raise UsageError(f"invalid {label} {value}: must be at least 0")


def check_size(label: str, value: int | None) -> None:
    """An option object's byte count: None (unset) or not negative."""
    if value is not None and value < 0:
        raise UsageError(f"invalid {label}: must not be negative")


def parse_int(text: str, *, low: int, high: int, what: str = "value") -> int:
    """A whole number written with ASCII digits (an optional sign), ``low`` to ``high``."""
    s = str(text).strip()
    if not re.fullmatch(r"[-+]?[0-9]{1,19}", s, re.ASCII):
        raise UsageError(f"invalid {what} {_shown(text)}: expected a whole number")
    v = int(s)
    if not low <= v <= high:
        raise UsageError(f"invalid {what} {_shown(text)}: must be {low} to {high}")
    return v


def parse_gpu_list(text: str) -> list[int]:
    """Parse ``"0,2-3"`` into ``[0, 2, 3]`` (sorted, without duplicates)."""
    out: set[int] = set()
    shown = _shown(text)
    for part in str(text).split(","):
        part = part.strip()
        m = re.fullmatch(r"([0-9]{1,6})(?:-([0-9]{1,6}))?", part, re.ASCII)
        if not m:
            raise UsageError(
                f"invalid GPU list {shown}: expected indexes and ranges like 0,2-3"
                + (f" (GPU indexes are 0 to {MAX_GPU_INDEX})" if re.fullmatch(r"[0-9-]+", part) else "")
            )
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise UsageError(f"invalid GPU range {_shown(part)} in {shown}: end before start")
        if hi > MAX_GPU_INDEX:
            raise UsageError(f"invalid GPU list {shown}: GPU indexes are 0 to {MAX_GPU_INDEX}")
        out.update(range(lo, hi + 1))
    return sorted(out)


def parse_gpu_selection(text: str) -> list[int] | str:
    """A ``--gpus`` value: a GPU list (:func:`parse_gpu_list`), or :data:`ALL_GPUS` for ``all``."""
    return ALL_GPUS if str(text).strip() == ALL_GPUS else parse_gpu_list(text)


def selected_gpus(value: list[int] | str | None) -> list[int] | None:
    """The GPUs a ``--gpus`` value (of :func:`parse_gpu_selection`) selects; None: every GPU
    (``all``, or the option not given, where that means all)."""
    return None if value is None or isinstance(value, str) else list(value)  # the one string is ALL_GPUS


def parse_host(text: str) -> str:
    """An address to connect to: an IPv4 or IPv6 literal, or a host name (RFC 1123).

    A name made only of digits and dots is an IPv4 address and must be a valid one
    (``999.1.1.1`` is no host name), so a typo fails here rather than in a resolver.
    """
    import ipaddress  # lazy: startup

    s = str(text)
    shown = _shown(text)
    if s.startswith("[") and s.endswith("]"):
        s = s[1:-1]
    try:
        return str(ipaddress.ip_address(s))
    except ValueError:
        pass
    if re.fullmatch(r"[0-9.]+", s, re.ASCII) or ":" in s:
        raise UsageError(f"invalid address {shown}: not a valid IPv4 or IPv6 address")
    label = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    if len(s) > 253 or not re.fullmatch(rf"{label}(?:\.{label})*\.?", s, re.ASCII):
        raise UsageError(f"invalid address {shown}: expected an IP address or a host name")
    return s


def parse_http_url(text: str) -> str:
    """An absolute ``http://`` or ``https://`` URL whose host and port parse."""
    from urllib.parse import urlsplit  # lazy: startup

    shown = _shown(text, 80)
    s = str(text)
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in s):
        raise UsageError(f"invalid URL {shown}: contains spaces or control characters")
    try:
        parts = urlsplit(s)
        port = parts.port  # raises ValueError for a bad port
        host = parts.hostname
    except ValueError as exc:
        raise UsageError(f"invalid URL {shown}: {exc}") from None
    if parts.scheme not in ("http", "https") or not host:
        raise UsageError(f"invalid URL {shown}: expected http://HOST[:PORT]/PATH")
    parse_host(host)
    if port is not None and not 1 <= port <= 65535:
        raise UsageError(f"invalid URL {shown}: port must be 1 to 65535")
    return s


def format_size(n: int | None) -> str:
    """Human size with binary units, e.g. ``40.0 GiB``; ``-`` for unknown."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_gpu_list(gpus: list[int]) -> str:
    """Inverse of :func:`parse_gpu_list`: ``[0, 2, 3]`` -> ``"0,2-3"``."""
    parts: list[str] = []
    for g in sorted(set(gpus)):
        if parts and "-" not in parts[-1] and int(parts[-1]) == g - 1:
            parts[-1] = f"{parts[-1]}-{g}"
        elif parts and "-" in parts[-1] and int(parts[-1].split("-")[1]) == g - 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{g}"
        else:
            parts.append(str(g))
    return ",".join(parts)


def gpus_phrase(gpus: Sequence[int]) -> str:
    """GPUs in a sentence, the one way every command says them: ``GPU 3``, ``GPUs 0-2,5``
    (:func:`format_gpu_list`), ``no GPU``. Tables print the bare list under their GPUs column."""
    n = len(set(gpus))
    return "no GPU" if n == 0 else f"GPU{'s' if n > 1 else ''} {format_gpu_list(list(gpus))}"

def parse_front(value: object) -> tuple[str, int]:
    """A front's address: ``PORT`` (on 127.0.0.1: never reachable from another host unless
    asked for) or ``HOST:PORT`` (``[::1]:PORT``); :class:`UsageError` otherwise."""
    text = str(value).strip()
    if isinstance(value, bool) or not text:
        raise UsageError(f"invalid front {value!r}: PORT or HOST:PORT")
    host, sep, port = text.rpartition(":")
    if not sep:
        host = "127.0.0.1"
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not host:
        raise UsageError(f"invalid front {value!r}: PORT or HOST:PORT")
    return parse_host(host), parse_int(port, low=1, high=65535, what="front port")


def format_front(host: str, port: int) -> str:
    """A front's address as the unit's spec and ``--front`` write it (``[::1]:8080`` for IPv6)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
