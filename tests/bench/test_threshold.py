"""The speculation threshold: a pure function of per-level, per-repeat throughputs.
Property tests (hypothesis) plus the crossover the simulated server's model implies."""

from __future__ import annotations

import json
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslate.bench.threshold import recommend
from gpuslate.simserver.perfmodel import PerfParams, throughput

LEVELS = (1, 2, 4, 8, 16, 32, 64)


def model_figures(mode: str, params: PerfParams, noise: float = 0.0) -> dict[int, list[float]]:
    """Two repeats per level: the model's figure -/+ a relative noise."""
    return {c: [throughput(mode, c, params) * (1 - noise), throughput(mode, c, params) * (1 + noise)]
            for c in LEVELS}


def test_simulated_pair_crossover_is_the_models():
    p = PerfParams()
    # where the model says speculation stops winning
    implied = max(c for c in LEVELS if throughput("speculative", c, p) > throughput("baseline", c, p))
    rec = recommend(model_figures("baseline", p, 0.01), model_figures("speculative", p, 0.01))
    assert implied == 1
    assert rec.decision == "disable_above" and rec.threshold == 1 and rec.crossover == (1, 2)
    assert not rec.crossover_in_noise
    assert rec.levels[0].winner == "speculative" and rec.levels[0].margin == pytest.approx(0.152, abs=0.01)
    assert all(v.winner == "baseline" for v in rec.levels[1:])
    # the step count measured, fixed ("on"), and 0 above: never the steps SGLang picks by itself
    sglang = rec.engine_forms()["sglang_adaptive_config"]
    assert {k: v for k, v in sglang.items() if k.isdigit()} == {"1": {"candidate_steps": [3]},
                                                                "2": {"candidate_steps": [0]}}
    assert vllm_schedule(rec) == [[1, 1, 3], [2, 64, 0]]
    assert rec.recommended and rec.deciding_levels == (1, 2) and not rec.missing_evidence
    doc = rec.to_json()
    json.dumps(doc)
    assert doc["engines"]["disable_batch_threshold"] == 1


def test_cheaper_speculation_moves_the_crossover_up():
    p = PerfParams(spec_per_request_ms=5.0)  # a cheaper draft: wins up to larger batches
    implied = [c for c in LEVELS if throughput("speculative", c, p) > throughput("baseline", c, p)]
    rec = recommend(model_figures("baseline", p, 0.005), model_figures("speculative", p, 0.005))
    assert rec.threshold == max(implied) == 4 and rec.crossover == (4, 8)


def test_crossover_within_noise_warns_and_stays_at_last_clear_win():
    base = {1: [100, 101], 2: [200, 230], 4: [300, 301]}
    spec = {1: [150, 151], 2: [210, 220], 4: [200, 201]}
    rec = recommend(base, spec)
    assert rec.threshold == 1 and rec.crossover == (1, 2) and rec.crossover_in_noise
    assert any("within drift + noise" in w for w in rec.warnings)
    assert not rec.recommended and "no threshold recommended" in rec.summary()
    assert rec.to_json()["recommended"] is False


def test_pairs_cancel_drift_that_blocks_would_see_as_a_difference():
    """Both deployments slow down 10% between repeats (drift). The repeats' own spread (~10%)
    hides a 2% edge: no detectable difference, though the ratio is 1.02 in every pair."""
    base = {1: [100.0, 90.0]}
    spec = {1: [102.0, 91.8]}
    assert recommend(base, spec).levels[0].winner == "tie"
    # a 20% edge stands out of that spread ...
    assert recommend(base, {1: [120.0, 108.0]}).levels[0].winner == "speculative"
    # ... until the measured drift is added on top
    rec = recommend(base, {1: [120.0, 108.0]}, drift=0.15)
    assert rec.levels[0].winner == "tie" and rec.decision == "always_off"
    assert any("drift measured over the run: 15.0%" in w for w in rec.warnings)
    lo, hi = rec.levels[0].interval
    half = 1.2 * max(12 / 114, 10 / 95) + 0.15
    assert lo == pytest.approx(1.2 - half) and hi == pytest.approx(1.2 + half)


@settings(deadline=None)
@given(st.floats(0.0, 0.5), st.floats(0.0, 0.5))
def test_more_drift_never_makes_a_win_out_of_a_tie(d1: float, d2: float):
    lo, hi = sorted((d1, d2))
    base = {c: [throughput("baseline", c, PerfParams())] * 2 for c in LEVELS}
    spec = {c: [throughput("speculative", c, PerfParams())] * 2 for c in LEVELS}
    a, b = recommend(base, spec, drift=lo), recommend(base, spec, drift=hi)
    for va, vb in zip(a.levels, b.levels):
        assert vb.winner == va.winner or vb.winner == "tie"


def test_single_repeat_warns_no_spread():
    rec = recommend({1: [100], 2: [200]}, {1: [120], 2: [150]})
    assert rec.threshold == 1 and any("no run-to-run spread" in w for w in rec.warnings)


def test_no_recommendation_without_its_evidence():
    """Issue 26: Ctrl-C at 13 of 72 points (one repeat, drift not measured) gave recommended: true with
    zero-width intervals. Two repeats at every deciding level and the drift measured, or nothing."""
    one = recommend({1: [100.0], 2: [200.0], 4: [300.0]}, {1: [114.0], 2: [150.0], 4: [100.0]},
                    drift_measured=False)
    assert one.threshold == 1 and one.levels[0].interval[0] == one.levels[0].interval[1]  # zero width
    assert not one.recommended and one.to_json()["recommended"] is False
    assert one.missing_evidence == ("fewer than 2 repeats of both deployments at concurrency 1, 2",
                                    "the drift was not measured")
    assert "too little evidence" in one.summary() and "concurrency 1, 2" in one.summary()
    # two repeats where it is decided (1 and 2) suffice; level 4 decides nothing
    enough = recommend({1: [100.0, 101.0], 2: [200.0, 202.0], 4: [300.0]},
                       {1: [114.0, 115.0], 2: [150.0, 151.0], 4: [100.0]})
    assert enough.recommended and enough.deciding_levels == (1, 2)
    assert not recommend({1: [100.0, 101.0], 2: [200.0, 202.0]}, {1: [114.0, 115.0], 2: [150.0, 151.0]},
                         drift_measured=False).recommended
    # never disable rests on every level, always off on the first
    assert recommend({1: [1.0, 1.0], 2: [1.0]}, {1: [9.0, 9.0], 2: [9.0]}).missing_evidence
    assert recommend({1: [9.0, 9.0], 2: [1.0]}, {1: [1.0, 1.0], 2: [9.0]}).recommended


def test_bad_input():
    with pytest.raises(ValueError):
        recommend({1: [1.0]}, {2: [1.0]})
    with pytest.raises(ValueError):
        recommend({1: [float("nan")]}, {1: [1.0]})


# -- properties ---------------------------------------------------------------------

levels_st = st.lists(st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 128, 256]), min_size=1, max_size=8,
                     unique=True).map(sorted)
value = st.floats(min_value=1.0, max_value=1e4, allow_nan=False)


@st.composite
def experiments(draw):
    levels = draw(levels_st)
    repeats = draw(st.integers(1, 3))
    base = {c: draw(st.lists(value, min_size=repeats, max_size=repeats)) for c in levels}
    spec = {c: draw(st.lists(value, min_size=repeats, max_size=repeats)) for c in levels}
    return base, spec


@settings(max_examples=300, deadline=None)
@given(experiments(), st.booleans())
def test_recommended_only_with_two_repeats_at_every_deciding_level_and_the_drift(exp, drift_measured):
    base, spec = exp
    rec = recommend(base, spec, drift_measured=drift_measured)
    deciding = set(rec.deciding_levels)
    assert deciding and deciding <= set(base)
    if rec.recommended:
        assert drift_measured and all(len(base[c]) >= 2 and len(spec[c]) >= 2 for c in deciding)
    elif drift_measured and all(len(base[c]) >= 2 and len(spec[c]) >= 2 for c in deciding):
        assert rec.decision == "disable_above" and rec.crossover_in_noise  # the only other reason


@settings(max_examples=300, deadline=None)
@given(experiments())
def test_never_recommends_beyond_largest_level(exp):
    base, spec = exp
    rec = recommend(base, spec)
    if rec.threshold is not None:
        assert 0 <= rec.threshold <= max(base)
        assert rec.threshold == 0 or rec.threshold in base  # always a measured level
        sched = vllm_schedule(rec)
        assert sched[0][0] == 1 and all(a[1] + 1 == b[0] for a, b in pairwise(sched))
        keys = sorted(int(k) for k in rec.engine_forms()["sglang_adaptive_config"] if k.isdigit())
        assert keys[0] == 1 and (rec.threshold == 0 or keys[-1] == rec.threshold + 1)


@settings(max_examples=300, deadline=None)
@given(experiments())
def test_never_wins_beyond_spread_means_always_off(exp):
    base, spec = exp
    # speculation at most the slowest baseline repeat everywhere: never a win beyond the spread
    spec = {c: [min(min(base[c]), v) for v in spec[c]] for c in spec}
    rec = recommend(base, spec)
    assert rec.decision == "always_off" and rec.threshold == 0
    assert rec.engine_forms()["sglang_adaptive_config"] == {"1": {"candidate_steps": [0]}}
    assert all(k == 0 for _, _, k in vllm_schedule(rec))


@settings(max_examples=300, deadline=None)
@given(experiments())
def test_always_wins_means_never_disable(exp):
    base, _ = exp
    spec = {c: [max(base[c]) * 1.5 + i for i in range(len(base[c]))] for c in base}
    rec = recommend(base, spec)
    assert rec.decision == "never_disable" and rec.threshold is None
    assert any("not measured beyond" in w for w in rec.warnings)
    assert all(k == rec.num_speculative_tokens for _, _, k in vllm_schedule(rec))


@settings(max_examples=300, deadline=None)
@given(experiments(), st.data())
def test_monotone_under_added_dominance(exp, data):
    """Making speculation clearly dominant at more levels never lowers the threshold."""
    base, spec = exp
    before = recommend(base, spec)
    better = dict(spec)
    for c in data.draw(st.lists(st.sampled_from(sorted(base)), unique=True)):
        better[c] = [max(base[c]) * 2 + 1] * len(spec[c])
    after = recommend(base, better)
    rank = lambda r: float("inf") if r.threshold is None else r.threshold  # noqa: E731
    assert rank(after) >= rank(before)


@settings(max_examples=200, deadline=None)
@given(experiments(), st.floats(min_value=0.0, max_value=0.5))
def test_a_larger_noise_margin_never_raises_the_threshold(exp, margin):
    base, spec = exp
    rank = lambda r: float("inf") if r.threshold is None else r.threshold  # noqa: E731
    assert rank(recommend(base, spec, min_margin=margin)) <= rank(recommend(base, spec))


def vllm_schedule(rec):
    """The recommendation's reference form for vLLM (the engines' own, gpuslate.engines)."""
    return rec.engine_forms()["vllm_speculative_config"]["num_speculative_tokens_per_batch_size"]
