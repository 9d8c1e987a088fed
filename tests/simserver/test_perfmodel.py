"""The performance model's closed form against the shape measured in the field.

Field facts (8 GPUs, SGLang, EAGLE-3 vs baseline): baseline saturates near
773 tok/s, speculative plateaus near 354 tok/s, and speculative is ahead only
at concurrency 1.
"""

from __future__ import annotations

import math

import pytest

from gpuslate.simserver.perfmodel import (
    PerfParams,
    TokenAccumulator,
    baseline_step_seconds,
    spec_step_seconds,
    step_kind,
    step_seconds,
    throughput,
    throughput_table,
)

CONCURRENCIES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
FIELD_BASELINE_SATURATION = 773.0
FIELD_SPEC_PLATEAU = 354.0


def within(value: float, target: float, rel: float) -> bool:
    return abs(value - target) <= rel * target


def test_baseline_saturates_near_field_value() -> None:
    for c in (128, 256):
        assert within(throughput("baseline", c), FIELD_BASELINE_SATURATION, 0.05), c
    # Saturating: never above the field value by more than the tolerance at any load.
    assert max(throughput("baseline", c) for c in CONCURRENCIES) <= FIELD_BASELINE_SATURATION * 1.05


def test_speculative_plateaus_near_field_value() -> None:
    for c in (32, 64, 128, 256):
        assert within(throughput("speculative", c), FIELD_SPEC_PLATEAU, 0.05), c


def test_speculative_ahead_only_at_concurrency_one() -> None:
    ahead = [c for c, base, spec in throughput_table(concurrencies=CONCURRENCIES) if spec > base]
    assert ahead == [1]


def test_throughput_grows_with_concurrency_in_both_modes() -> None:
    for mode in ("baseline", "speculative"):
        values = [throughput(mode, c) for c in CONCURRENCIES]
        assert values == sorted(values), mode


@pytest.mark.parametrize("threshold", [0, 1, 4, 16, 256])
def test_threshold_mode_is_spec_up_to_t_and_baseline_above(threshold: int) -> None:
    for c in CONCURRENCIES:
        got = throughput("speculative", c, spec_disable_threshold=threshold)
        expected_mode = "speculative" if c <= threshold else "baseline"
        assert got == throughput(expected_mode, c), (threshold, c)


def test_step_kind() -> None:
    assert step_kind("baseline", 1, None) == "baseline"
    assert step_kind("speculative", 300, None) == "spec"
    assert step_kind("speculative", 4, 4) == "spec"
    assert step_kind("speculative", 5, 4) == "baseline"
    with pytest.raises(ValueError):
        step_kind("eagle", 1, None)


def test_speculative_step_cost_grows_faster_with_batch() -> None:
    p = PerfParams()
    base_slope = baseline_step_seconds(2, p) - baseline_step_seconds(1, p)
    spec_slope = spec_step_seconds(2, p) - spec_step_seconds(1, p)
    assert spec_slope > base_slope > 0
    assert step_seconds("spec", 8, p) == spec_step_seconds(8, p)
    assert step_seconds("baseline", 8, p) == baseline_step_seconds(8, p)


@pytest.mark.parametrize("accept", [1.0, 2.5, 3.0, 3.3, 4.75])
def test_accumulator_delivers_fractional_mean_exactly(accept: float) -> None:
    p = PerfParams(accept_length=accept)
    acc = TokenAccumulator()
    total = 0
    for step in range(1, 1001):
        got = acc.take("spec", p)
        assert got >= 1  # every speculative step yields at least the bonus token
        total += got
        assert total == math.floor(step * accept + 1e-6), step
    assert TokenAccumulator().take("baseline", p) == 1


def test_closed_form_matches_a_step_by_step_simulation() -> None:
    """Replaying the scheduler's arithmetic (batch fixed at C) gives the formula."""
    p = PerfParams(accept_length=2.7)
    for mode in ("baseline", "speculative"):
        for c in (1, 3, 16):
            kind = step_kind(mode, c, None)
            accs = [TokenAccumulator() for _ in range(c)]
            steps = 500
            tokens = sum(a.take(kind, p) for _ in range(steps) for a in accs)
            simulated = tokens / (steps * step_seconds(kind, c, p))
            assert within(simulated, throughput(mode, c, p), 0.01), (mode, c)


def test_prefill_is_amortised_over_output_length() -> None:
    p = PerfParams(prefill_ms_per_token=0.05)
    decode_only = throughput("baseline", 8, p)
    with_prefill = throughput("baseline", 8, p, prompt_tokens=1000, output_tokens=100)
    step = baseline_step_seconds(8, p) + 8 * 1 / 100 * 0.05 * 1000 / 1000
    assert with_prefill == pytest.approx(8 / step)
    assert with_prefill < decode_only
    assert throughput("baseline", 8, p, prompt_tokens=1000) == decode_only


def test_running_batch_is_capped() -> None:
    assert throughput("baseline", 512, max_running_requests=256) == throughput("baseline", 256)
    with pytest.raises(ValueError):
        throughput("baseline", 0)


@pytest.mark.parametrize("bad", [
    {"accept_length": 0.5},
    {"accept_length": float("nan")},
    {"base_step_ms": -1.0},
    {"spec_per_request_ms": float("inf")},
    {"base_step_ms": 0.0, "base_per_request_ms": 0.0},
])
def test_params_validation(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        PerfParams(**bad).validate()
    PerfParams().validate()
