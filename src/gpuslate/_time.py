"""Time formatting shared by every JSON document (no datetime import on the hot path)."""

from __future__ import annotations

import time


def iso_time(epoch: float) -> str:
    """UTC ISO-8601 with milliseconds (no datetime import on the hot path)."""
    whole = int(epoch // 1)
    ms = round((epoch - whole) * 1000)
    if ms == 1000:  # rounds up to the next second (a hair below one: gmtime must get that second)
        whole, ms = whole + 1, 0
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{ms:03d}Z"


def format_duration(s: float | None) -> str:
    """A length of time as ``ps`` shows it: ``4.2s``, ``3m07s``, ``2h05m``; ``-`` when unknown."""
    if s is None:
        return "-"
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"


def parse_iso_time(text: object) -> float:
    """Epoch seconds of an :func:`iso_time` string (another host's document); 0.0 if unreadable.

    Read by position, not with ``time.strptime``: its module (``_strptime``, with ``datetime``,
    ``calendar`` and ``locale``) costs a few milliseconds to import, and every command shows its
    result read back from its document (``status`` included). What it takes is what
    ``calendar.timegm(time.strptime(text[:19], "%Y-%m-%dT%H:%M:%S"))`` took (tests/test_time.py
    compares them), with a ``.fraction`` after the seconds."""
    if not isinstance(text, str) or len(text) < 19 or not text.isascii():
        return 0.0
    head = text[:19]
    if head[4] != "-" or head[7] != "-" or head[10] != "T" or head[13] != ":" or head[16] != ":":
        return 0.0
    digits = (head[0:4], head[5:7], head[8:10], head[11:13], head[14:16], head[17:19])
    if not all(d.isdigit() for d in digits):
        return 0.0
    year, month, day, hour, minute, sec = (int(d) for d in digits)
    if not (1 <= month <= 12 and 1 <= day <= _days_in(year, month) and hour < 24 and minute < 60 and sec < 62):
        return 0.0
    frac = text[19:].rstrip("Z")
    return _epoch(year, month, day) + hour * 3600 + minute * 60 + sec + (
        float(frac) if frac.startswith(".") and frac[1:].isdigit() else 0.0)


def _days_in(year: int, month: int) -> int:
    if month == 2:
        return 29 if year % 4 == 0 and (year % 100 != 0 or year % 400 == 0) else 28
    return 30 if month in (4, 6, 9, 11) else 31


def _epoch(year: int, month: int, day: int) -> int:
    """Seconds from 1970-01-01 to that day (proleptic Gregorian, UTC): H. Hinnant's days_from_civil,
    what ``calendar.timegm`` computes."""
    y = year - (month <= 2)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return (era * 146097 + doe - 719468) * 86400


def iso_time_us(epoch: float) -> str:
    """UTC RFC 3339 with microseconds (a log line's time, as ``logs --timestamps`` prints it)."""
    whole = int(epoch // 1)
    us = round((epoch - whole) * 1_000_000)
    if us == 1_000_000:
        whole, us = whole + 1, 0
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{us:06d}Z"


_MAX_SINCE = 64  # characters: a time or a duration is never longer


def parse_since(text: str, now: float) -> float:
    """The epoch time ``--since TEXT`` means, as ``docker logs --since`` reads it: a duration back
    from ``now`` (Go's syntax, the one duration parser: ``42m``, ``1h30m``, ``1.5h``, ``300ms``), an
    RFC 3339 time (``2013-01-02T13:23:37Z``, ``...37.5+02:00``; without a zone, local time, as
    docker), a date (``2013-01-02``, local midnight) or Unix seconds (``1700000000.5``).
    Raises ValueError with what was expected."""
    import re  # lazy: startup

    from ._parse import parse_duration  # lazy: startup (only logs --since reads a time)

    s = text.strip()
    if not s or len(s) > _MAX_SINCE:
        raise ValueError(f"{text[:_MAX_SINCE]!r}: expected a duration (10m, 1h30m) or a time (2013-01-02T13:23:37Z)")
    back = parse_duration(s)
    if back is not None:
        return now - back
    if re.fullmatch(r"\d+(\.\d+)?", s):
        return float(s)
    m = re.fullmatch(r"(\d{4})-(\d\d)-(\d\d)(?:[T ](\d\d):(\d\d)(?::(\d\d)(\.\d+)?)?)?"
                     r"(Z|z|[+-]\d\d:?\d\d)?", s)
    if not m:
        raise ValueError(f"{text!r}: expected a duration (10m, 1h30m) or a time (2013-01-02T13:23:37Z)")
    import calendar  # lazy: startup

    year, month, day, hour, minute, sec, frac, zone = m.groups()
    fields = (int(year), int(month), int(day), int(hour or 0), int(minute or 0), int(sec or 0))
    if not (1 <= fields[1] <= 12 and 1 <= fields[2] <= 31 and fields[3] < 24 and fields[4] < 60 and fields[5] < 61):
        raise ValueError(f"{text!r}: not a time")
    extra = float(frac) if frac else 0.0
    if zone is None:  # local time, as docker reads a time without a zone
        return time.mktime((*fields, 0, 0, -1)) + extra
    offset = 0
    if zone not in ("Z", "z"):
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        offset = sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    return calendar.timegm((*fields, 0, 0, 0)) - offset + extra
