"""``_record.Record``: wide results built by keywords only, immutable, with a NamedTuple's helpers."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpuslate.clearing.wait import WaitResult


def _wait(**changes: object) -> WaitResult:
    base: dict[str, object] = {"ok": True, "gpus": [0], "max_used": 1, "elapsed_s": 0.5, "readings": [],
                               "diagnosis": []}
    return WaitResult(**{**base, **changes})  # type: ignore[arg-type]


def test_keywords_only_immutable_equal_and_replaceable():
    r = _wait()
    with pytest.raises(TypeError):
        WaitResult(True, [0], 1, 0.5, [], [])  # type: ignore[misc]
    with pytest.raises(AttributeError):
        r.ok = False  # type: ignore[misc]
    assert r == _wait() and r != _wait(max_used=2) and r._replace(max_used=2) == _wait(max_used=2)
    assert r._asdict()["elapsed_s"] == 0.5 and r.baseline == () and r.leaked is False
    assert repr(r).startswith("WaitResult(ok=True, gpus=[0], max_used=1,")
    assert WaitResult.from_json(r.to_json()) == r


def test_clear_imports_no_dataclasses():
    """The reason Record exists: ``dataclasses`` (with ``inspect``, ``ast``) costs ``clear`` ~10 ms at start."""
    code = "import sys, gpuslate.clearing.clear; print('dataclasses' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
