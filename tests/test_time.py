"""gpuslate/_time.py: the document times, read back without ``time.strptime`` exactly as it read them."""

from __future__ import annotations

import calendar
import subprocess
import sys
import time

from hypothesis import given
from hypothesis import strategies as st

from gpuslate._time import iso_time, parse_iso_time


def _by_strptime(text: object) -> float:
    """What parse_iso_time returned when it used strptime (the reference)."""
    if not isinstance(text, str):
        return 0.0
    try:
        whole = calendar.timegm(time.strptime(text[:19], "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return 0.0
    frac = text[19:].rstrip("Z")
    return whole + (float(frac) if frac.startswith(".") and frac[1:].isdigit() else 0.0)


@given(st.floats(min_value=-2e9, max_value=2e10, allow_nan=False))
def test_every_time_written_reads_back(epoch: float) -> None:
    text = iso_time(epoch)
    assert parse_iso_time(text) == _by_strptime(text)
    assert abs(parse_iso_time(text) - epoch) <= 0.0006


_FIELDS = st.tuples(st.integers(1000, 9999), st.integers(0, 13), st.integers(0, 32), st.integers(0, 25),
                    st.integers(0, 61), st.integers(0, 62))


@given(_FIELDS, st.sampled_from(["", "Z", ".123Z", ".5", ".x", "+00:00"]))
def test_any_date_reads_as_strptime_read_it(fields: tuple[int, ...], tail: str) -> None:
    y, mo, d, h, mi, s = fields
    text = f"{y:04d}-{mo:02d}-{d:02d}T{h:02d}:{mi:02d}:{s:02d}{tail}"  # Feb 29, Apr 31, month 13...
    assert parse_iso_time(text) == _by_strptime(text), text


@given(st.text(max_size=30))
def test_any_text_reads_as_strptime_read_it_or_unreadable(text: str) -> None:
    ours = parse_iso_time(text)
    # strptime also took a few non-canonical spellings (' 1-...', one-digit fields); no document writes them
    assert ours == _by_strptime(text) or ours == 0.0, text


def test_unreadable_is_zero_and_reading_imports_no_strptime() -> None:
    for bad in (None, 12, "", "2026-12-02", "2026-02-30T00:00:00Z", "2026-12-02 10:00:00Z", "２０２６-12-02T00:00:00"):
        assert parse_iso_time(bad) == 0.0, bad
    code = ("import sys; from gpuslate._time import parse_iso_time; parse_iso_time('2026-12-02T10:00:00.5Z'); "
            "print(sorted({'_strptime', 'calendar', 'datetime'} & set(sys.modules)))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"
