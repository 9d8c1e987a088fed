"""Time formatting shared by every JSON document (no datetime import on the hot path)."""

from __future__ import annotations

import time


def iso_time(epoch: float) -> str:
    """UTC ISO-8601 with milliseconds (no datetime import on the hot path)."""
    ms = round((epoch % 1) * 1000)
    if ms == 1000:
        epoch, ms = epoch + 1, 0
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch)) + f".{ms:03d}Z"


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
    """Epoch seconds of an :func:`iso_time` string (another host's document); 0.0 if unreadable."""
    import calendar  # lazy: startup

    if not isinstance(text, str):
        return 0.0
    try:
        whole = calendar.timegm(time.strptime(text[:19], "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return 0.0
    frac = text[19:].rstrip("Z")
    return whole + (float(frac) if frac.startswith(".") and frac[1:].isdigit() else 0.0)
