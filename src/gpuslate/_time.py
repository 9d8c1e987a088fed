"""Time formatting shared by every JSON document (no datetime import on the hot path)."""

from __future__ import annotations

import time


def iso_time(epoch: float) -> str:
    """UTC ISO-8601 with milliseconds (no datetime import on the hot path)."""
    ms = round((epoch % 1) * 1000)
    if ms == 1000:
        epoch, ms = epoch + 1, 0
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch)) + f".{ms:03d}Z"


def parse_iso_time(text: object) -> float:
    """Epoch seconds of an :func:`iso_time` string (another host's document); 0.0 if unreadable."""
    import calendar

    if not isinstance(text, str):
        return 0.0
    try:
        whole = calendar.timegm(time.strptime(text[:19], "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return 0.0
    frac = text[19:].rstrip("Z")
    return whole + (float(frac) if frac.startswith(".") and frac[1:].isdigit() else 0.0)
