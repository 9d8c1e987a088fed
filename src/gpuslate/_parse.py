"""Parsing and formatting of the values users type: GPU lists and sizes."""

from __future__ import annotations

import re

from .errors import UsageError

_SIZE_PATTERN = r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$"
_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2,
    "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}


def parse_size(text: str | int) -> int:
    """Parse ``"40GiB"``, ``"512MiB"``, ``"1.5GB"``, ``"0"`` or a byte count into bytes."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise UsageError(f"invalid size {text!r}: must not be negative")
        return text
    m = re.match(_SIZE_PATTERN, str(text))
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS:
        raise UsageError(
            f"invalid size {text!r}: expected a number with an optional unit "
            "(B, KiB, MiB, GiB, TiB, KB, MB, GB, TB), e.g. 40GiB"
        )
    return int(round(float(m.group(1)) * _UNITS[unit]))


def parse_gpu_list(text: str) -> list[int]:
    """Parse ``"0,2-3"`` into ``[0, 2, 3]`` (sorted, without duplicates)."""
    out: set[int] = set()
    for part in str(text).split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise UsageError(
                f"invalid GPU list {text!r}: expected indexes and ranges like 0,2-3"
            )
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise UsageError(f"invalid GPU range {part!r} in {text!r}: end before start")
        out.update(range(lo, hi + 1))
    return sorted(out)


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
