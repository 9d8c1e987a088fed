"""Where speculative decoding stops paying off: a pure decision from measured figures.

Input: for a baseline and a speculative deployment, the output throughput
(tokens/s) of every repeat at every concurrency level. Output: per level the
winner and the margin with the run-to-run spread, the crossover, and the
batch-size threshold ``T`` ("speculate while the running batch is at most T")
above which speculation should be switched off. The threshold in an engine's
own terms, with the speculative deployment's settings kept, is
:mod:`gpuslate.engines`'s (``engines`` in the document below is the
same threshold in each engine's form with the K given, for reference).

The decision is deliberately conservative:

* each level compares the two as a ratio (speculative / baseline) with an
  interval: the larger of the paired ratios' half-range and the spread each
  side shows between its own repeats (which, in an interleaved run, were
  measured at different times and so carry the drift), plus ``drift`` (a
  blocked run's control drift, which its back-to-back repeats cannot see);
  a level counts as a
  speculative win only when the whole interval lies above ``1 + min_margin``,
  a baseline win only when it lies below ``1 / (1 + min_margin)``, anything
  else is "no detectable difference";
* the threshold is the largest level ``L`` such that speculation won at every
  measured level up to and including ``L``: it is always a measured level, so
  nothing is extrapolated between or past the levels measured;
* speculation never winning at the smallest level gives "always off"
  (threshold 0); winning at every level gives "never disable", with a note
  that this holds only up to the largest level measured;
* a threshold is *recommended* only where the crossover is outside drift +
  noise: when the level after the last win shows no detectable difference,
  the threshold is reported but marked not recommended;
* and only with its evidence: at least two repeats of both deployments at
  every level that decides it (the wins up to the threshold and the level
  after it; the first level for "always off"; every level for "never
  disable") and the drift measured. Without them there is no interval worth
  the name (one repeat has no spread: ``[1.1397, 1.1397]``), so nothing is
  recommended and the missing evidence is named.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..engines import reference_forms

Winner = Literal["speculative", "baseline", "tie"]
Decision = Literal["disable_above", "always_off", "never_disable"]

MIN_REPEATS = 2  # at each deciding level, for a recommendation


def ratio_interval(num: Sequence[float], den: Sequence[float], drift: float = 0.0,
                   noise: float = 0.0) -> tuple[float, float, float]:
    """(mean ratio, low, high) of ``num / den`` over repeats.

    The half-width is the larger of the paired ratios' half-range (repeat r with repeat r, when
    both have the same repeats) and the run-to-run noise: the larger relative range (max - min)
    / mean of the two sides' own repeats, or ``noise`` (the same figure pooled over more
    deployments) if larger; plus ``drift``. With two or three repeats a range of two ratios alone
    is far too optimistic: what counts as a difference is what beats the spread every deployment
    shows between its own repeats. A zero denominator gives an infinite ratio."""
    def div(a: float, b: float) -> float:
        return a / b if b > 0 else (math.inf if a > 0 else 1.0)

    mean = div(sum(num) / len(num), sum(den) / len(den))
    if len(num) == len(den):
        qs = [div(a, b) for a, b in zip(num, den)]
        paired = (max(qs) - min(qs)) / 2
    else:
        paired = (div(max(num), min(den)) - div(min(num), max(den))) / 2
    spread = max(_rel_spread(tuple(num)), _rel_spread(tuple(den)), noise)
    half = max(paired, mean * spread if math.isfinite(mean) else 0.0) + drift
    return mean, mean - half, mean + half


@dataclass(frozen=True)
class LevelVerdict:
    concurrency: int
    baseline: tuple[float, ...]  # output tok/s of each repeat
    speculative: tuple[float, ...]
    winner: Winner
    drift: float = 0.0  # relative drift measured over the run, added to the interval

    @property
    def interval(self) -> tuple[float, float]:
        """Speculative / baseline: the range the ratio is known to lie in (noise + drift)."""
        _, lo, hi = ratio_interval(self.speculative, self.baseline, self.drift)
        return lo, hi

    @property
    def baseline_mean(self) -> float:
        return sum(self.baseline) / len(self.baseline)

    @property
    def speculative_mean(self) -> float:
        return sum(self.speculative) / len(self.speculative)

    @property
    def margin(self) -> float:
        """Speculative over baseline, relative: +0.15 is 15% faster, -0.5 half as fast."""
        b = self.baseline_mean
        return self.speculative_mean / b - 1.0 if b > 0 else math.inf

    @property
    def spread(self) -> float:
        """The larger of the two run-to-run spreads, (max - min) / mean of each deployment's repeats."""
        return max(_rel_spread(self.baseline), _rel_spread(self.speculative))

    def to_json(self) -> dict[str, Any]:
        lo, hi = self.interval
        return {"concurrency": self.concurrency, "winner": self.winner,
                "baseline_tok_s": _r(self.baseline_mean), "speculative_tok_s": _r(self.speculative_mean),
                "margin": _r(self.margin, 4), "spread": _r(self.spread, 4),
                "ratio_interval": [_r(lo, 4), _r(hi, 4)], "drift": _r(self.drift, 4),
                "baseline_repeats": [_r(v) for v in self.baseline],
                "speculative_repeats": [_r(v) for v in self.speculative]}


@dataclass(frozen=True)
class Recommendation:
    levels: tuple[LevelVerdict, ...]
    decision: Decision
    threshold: int | None  # speculate while the batch is <= threshold; 0: always off; None: never disable
    crossover: tuple[int, int] | None  # (last level speculation won, the next level measured)
    crossover_in_noise: bool  # the level after the last win is a tie, not a clear baseline win
    warnings: tuple[str, ...]
    num_speculative_tokens: int
    drift: float = 0.0
    missing_evidence: tuple[str, ...] = ()  # why it is not recommended yet (repeats, drift)

    @property
    def recommended(self) -> bool:
        """Recommended only with its evidence, and where the crossover is outside drift + noise."""
        return not self.missing_evidence and (self.decision != "disable_above" or not self.crossover_in_noise)

    @property
    def deciding_levels(self) -> tuple[int, ...]:
        """The levels the decision rests on: the wins up to the threshold and the level after it
        (disable above), the first level (always off), every level (never disable)."""
        return deciding_levels([v.concurrency for v in self.levels], self.decision, self.threshold)

    @property
    def largest_level(self) -> int:
        return self.levels[-1].concurrency

    def engine_forms(self) -> dict[str, Any]:
        """The threshold in every engine's form with K (``gpuslate.engines``: each engine's
        ``reference``), for the document's reference forms; the files to use are ``apply``'s."""
        return reference_forms(self.num_speculative_tokens, self.threshold, self.largest_level)

    def summary(self) -> str:
        """One sentence for people."""
        if self.missing_evidence and self.decision != "disable_above":
            what = "leave it off" if self.decision == "always_off" else "never disable it"
            return f"no recommendation yet ({what}, on too little evidence): " + "; ".join(self.missing_evidence)
        if self.decision == "always_off":
            return ("speculation never won beyond the run-to-run spread: leave it off "
                    f"(measured {self.levels[0].concurrency}..{self.largest_level})")
        if self.decision == "never_disable":
            return (f"speculation won at every level measured (up to {self.largest_level}): never disable it "
                    "within that range")
        assert self.crossover is not None
        if self.missing_evidence:
            return (f"no threshold recommended yet: speculation wins up to concurrency {self.threshold} "
                    f"(crossover between {self.crossover[0]} and {self.crossover[1]}) on too little evidence: "
                    + "; ".join(self.missing_evidence))
        if not self.recommended:
            return (f"no threshold recommended: speculation wins up to concurrency {self.threshold}, but at "
                    f"{self.crossover[1]} the difference is within drift + noise, so the crossover is not located "
                    f"(measure more levels or repeats)")
        return (f"speculation wins up to concurrency {self.threshold}; disable it above {self.threshold} "
                f"(crossover between {self.crossover[0]} and {self.crossover[1]})")

    def to_json(self) -> dict[str, Any]:
        return {
            "decision": self.decision, "threshold": self.threshold, "recommended": self.recommended,
            "drift": _r(self.drift, 4), "missing_evidence": list(self.missing_evidence),
            "deciding_levels": list(self.deciding_levels),
            "crossover": list(self.crossover) if self.crossover else None,
            "crossover_in_noise": self.crossover_in_noise, "summary": self.summary(),
            "warnings": list(self.warnings), "levels": [v.to_json() for v in self.levels],
            "engines": self.engine_forms(),
        }



def deciding_levels(levels: list[int], decision: str, threshold: int | None) -> tuple[int, ...]:
    """See :attr:`Recommendation.deciding_levels`."""
    if decision == "never_disable":
        return tuple(levels)
    if decision == "always_off" or threshold is None:
        return tuple(levels[:1])
    after = [c for c in levels if c > threshold][:1]
    return tuple([c for c in levels if c <= threshold] + after)


def recommend(baseline: Mapping[int, Sequence[float]], speculative: Mapping[int, Sequence[float]], *,
              min_margin: float = 0.0, num_speculative_tokens: int = 3,
              drift: float | Mapping[int, float] = 0.0, drift_measured: bool = True) -> Recommendation:
    """Compare per-level, per-repeat output throughputs and recommend a disable threshold.

    Only levels measured for both deployments (with at least one repeat each) are used;
    repeats are paired by position (repeat r of one with repeat r of the other). ``drift``
    (relative, >= 0; one figure, or one per level with the largest for levels it lacks)
    widens the intervals; ``drift_measured`` False (the run could not measure it) leaves the
    decision without its evidence: not recommended.
    Raises ValueError when there is no such level or a figure is not a finite number >= 0.
    """
    if not (math.isfinite(min_margin) and min_margin >= 0):
        raise ValueError(f"min_margin must be a finite number >= 0, got {min_margin!r}")
    drifts = dict(drift) if isinstance(drift, Mapping) else {}
    overall = max(drifts.values(), default=0.0) if isinstance(drift, Mapping) else float(drift)
    if not all(math.isfinite(d) and d >= 0 for d in [overall, *drifts.values()]):
        raise ValueError(f"drift must be finite numbers >= 0, got {drift!r}")
    if num_speculative_tokens < 1:
        raise ValueError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
    common = sorted(c for c in set(baseline) & set(speculative) if baseline[c] and speculative[c])
    if not common:
        raise ValueError("no concurrency level was measured for both the baseline and the speculative deployment")
    verdicts = []
    for c in common:
        b, s = tuple(float(v) for v in baseline[c]), tuple(float(v) for v in speculative[c])
        if c < 1 or not all(math.isfinite(v) and v >= 0 for v in b + s):
            raise ValueError(f"level {c}: figures must be finite numbers >= 0 and levels >= 1")
        d = drifts.get(c, overall)
        verdicts.append(LevelVerdict(c, b, s, _winner(b, s, min_margin, d), d))

    warnings: list[str] = []
    if all(len(v.baseline) < 2 or len(v.speculative) < 2 for v in verdicts):
        warnings.append("one repeat per level: no run-to-run spread was measured (set repeats >= 2)")
    prefix = 0
    while prefix < len(verdicts) and verdicts[prefix].winner == "speculative":
        prefix += 1
    if any(v.winner == "speculative" for v in verdicts[prefix:]):
        later = [v.concurrency for v in verdicts[prefix:] if v.winner == "speculative"]
        warnings.append("speculation wins again at concurrency " + ", ".join(map(str, later))
                        + " after losing or tying below it; the threshold keeps only the wins from the smallest level")

    crossover, in_noise = None, False
    if prefix == len(verdicts):
        decision: Decision = "never_disable"
        threshold = None
        warnings.append(f"not measured beyond concurrency {verdicts[-1].concurrency}: "
                        "whether speculation keeps winning above it is unknown")
    elif prefix == 0:
        decision, threshold = "always_off", 0
        if verdicts[0].winner == "tie":
            in_noise = True
            warnings.append(f"at concurrency {verdicts[0].concurrency} the difference is within the run-to-run "
                            "spread: speculation is not shown to win anywhere")
    else:
        decision, threshold = "disable_above", verdicts[prefix - 1].concurrency
        nxt = verdicts[prefix]
        crossover = (threshold, nxt.concurrency)
        if nxt.winner == "tie":
            in_noise = True
            lo, hi = nxt.interval
            warnings.append(f"the crossover is within drift + noise: at concurrency {nxt.concurrency} the ratio "
                            f"is {nxt.margin + 1:.3f} in [{lo:.3f}, {hi:.3f}] (drift {nxt.drift:.1%}), no detectable "
                            f"difference; the last clear win is {threshold}, but no threshold is recommended")
    if overall > 0:
        warnings.append(f"drift measured over the run: {overall:.1%} (added to every interval)")
    missing: list[str] = []
    deciding = set(deciding_levels([v.concurrency for v in verdicts], decision, threshold))
    thin = [v.concurrency for v in verdicts if v.concurrency in deciding
            and min(len(v.baseline), len(v.speculative)) < MIN_REPEATS]
    if thin:
        missing.append(f"fewer than {MIN_REPEATS} repeats of both deployments at concurrency "
                       + ", ".join(map(str, thin)))
    if not drift_measured:
        missing.append("the drift was not measured")
    return Recommendation(tuple(verdicts), decision, threshold, crossover, in_noise, tuple(warnings),
                          num_speculative_tokens, overall, tuple(missing))


def _winner(b: tuple[float, ...], s: tuple[float, ...], min_margin: float, drift: float = 0.0) -> Winner:
    """A win is a ratio interval wholly on one side, or (a separation no interval can argue with)
    every repeat of one side beating every repeat of the other by the margin and the drift."""
    _, lo, hi = ratio_interval(s, b, drift)
    edge = (1.0 + min_margin) * (1.0 + drift)
    if lo > 1.0 + min_margin or min(s) > max(b) * edge:
        return "speculative"
    if hi * (1.0 + min_margin) < 1.0 or min(b) > max(s) * edge:
        return "baseline"
    return "tie"


def _rel_spread(xs: tuple[float, ...]) -> float:
    mean = sum(xs) / len(xs)
    return (max(xs) - min(xs)) / mean if mean > 0 else 0.0


def _r(v: float, nd: int = 2) -> float | None:
    return round(v, nd) if math.isfinite(v) else None
