"""Benchmarks of OpenAI-compatible servers: the load generator behind ``gpuslate bench``.

Public API (the experiment runner codes against it; extended only compatibly)::

    from gpuslate.bench import LoadPlan, Progress, BenchResult, LevelResult, run_bench, run_bench_async

Metric definitions: :mod:`gpuslate.bench.metrics` and docs/bench.md.
"""

from __future__ import annotations

from .loadgen import BenchResult, LoadPlan, Progress, parse_levels, run_bench, run_bench_async
from .metrics import LevelResult, RequestRecord, Summary

__all__ = ["BenchResult", "LevelResult", "LoadPlan", "Progress", "RequestRecord", "Summary",
           "parse_levels", "run_bench", "run_bench_async"]
