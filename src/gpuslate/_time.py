"""Time formatting shared by every JSON document (no datetime import on the hot path)."""

from __future__ import annotations

import time

def iso_time(epoch: float) -> str:
    """UTC ISO-8601 with milliseconds (no datetime import on the hot path)."""
    ms = int(round((epoch % 1) * 1000))
    if ms == 1000:
        epoch, ms = epoch + 1, 0
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch)) + f".{ms:03d}Z"
