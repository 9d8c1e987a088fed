"""Benchmarks of OpenAI-compatible servers: the load generator behind ``gpuslate bench``.

Public API (the experiment runner codes against it; extended only compatibly)::

    from gpuslate.bench import LoadPlan, Progress, BenchResult, LevelResult, run_bench, run_bench_async

Metric definitions: :mod:`gpuslate.bench.metrics` and docs/bench.md. The
modules are laid out in :mod:`gpuslate.bench.loadgen`'s docstring.

``run_bench`` and ``run_bench_async`` are imported on first use (PEP 562):
they need aiohttp (the ``bench`` extra), the plans, results and reports do not.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .metrics import LevelResult, RequestRecord, Summary
from .plan import LoadPlan, parse_levels
from .result import BenchResult, Progress

if TYPE_CHECKING:
    from .loadgen import run_bench, run_bench_async

_LAZY = {"run_bench": "gpuslate.bench.loadgen", "run_bench_async": "gpuslate.bench.loadgen"}

__all__ = ["BenchResult", "LevelResult", "LoadPlan", "Progress", "RequestRecord", "Summary",
           "parse_levels", "run_bench", "run_bench_async"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gpuslate.bench' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
