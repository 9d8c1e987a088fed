"""Performance model of the simulated inference server (pure: no I/O, no clock).

The simulated server runs continuous batching: each *step* every request in
the running batch receives some tokens, and the step takes a modelled time
that depends on the batch size ``b`` and on the kind of step.

* baseline step: 1 token per request, ``t_base(b) = base_step_ms + base_per_request_ms * b``
* speculative step: ``accept_length`` tokens per request on average,
  ``t_spec(b) = spec_step_ms + spec_per_request_ms * b``

The speculative step is dearer per request (draft model plus verification
of several draft tokens per request), so its cost grows faster with ``b``.
That is the whole reason speculation wins only at tiny batches: at ``b = 1``
the fixed cost dominates and ``accept_length`` tokens per step pay off; at
large ``b`` the per-request term dominates and the throughput ratio tends to
``accept_length * base_per_request_ms / spec_per_request_ms``.

The defaults are tuned so that the closed-form steady state reproduces the
shape measured in the field on 8 GPUs (SGLang, EAGLE-3 vs baseline): baseline
saturating near 773 tok/s, speculative plateauing near 354 tok/s, and
speculative ahead of baseline only at concurrency 1. ``docs/sim-server.md``
has the table.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal

Mode = Literal["baseline", "speculative"]
StepKind = Literal["baseline", "spec"]

MODES: tuple[str, ...] = ("baseline", "speculative")


@dataclass(frozen=True)
class PerfParams:
    """Parameters of the step-time model; times in (unscaled) milliseconds."""

    base_step_ms: float = 3.5
    base_per_request_ms: float = 1.28
    spec_step_ms: float = 4.0
    spec_per_request_ms: float = 8.45
    accept_length: float = 3.0
    prefill_ms_per_token: float = 0.01
    # a step whose kind differs from the previous step's (speculation switched on or off) pays this once:
    # what vLLM issue #49548 measured as a collapse at the threshold (CUDA-graph shapes, draft state); 0: free
    switch_ms: float = 0.0

    def validate(self) -> None:
        """Raise ValueError (one line) on a parameter the model cannot use."""
        for name in ("base_step_ms", "base_per_request_ms", "spec_step_ms",
                     "spec_per_request_ms", "prefill_ms_per_token", "switch_ms"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        # A zero-cost step would make the scheduler spin without yielding time.
        if self.base_step_ms + self.base_per_request_ms <= 0:
            raise ValueError("baseline step time must be > 0 (base_step_ms + base_per_request_ms)")
        if self.spec_step_ms + self.spec_per_request_ms <= 0:
            raise ValueError("speculative step time must be > 0 (spec_step_ms + spec_per_request_ms)")
        # Speculative decoding always yields at least the verified bonus token.
        if not math.isfinite(self.accept_length) or self.accept_length < 1:
            raise ValueError(f"accept_length must be >= 1, got {self.accept_length!r}")

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def baseline_step_seconds(batch: int, params: PerfParams) -> float:
    """Modelled time of one baseline decode step with ``batch`` running requests."""
    return (params.base_step_ms + params.base_per_request_ms * batch) / 1000.0


def spec_step_seconds(batch: int, params: PerfParams) -> float:
    """Modelled time of one speculative (draft + verify) step."""
    return (params.spec_step_ms + params.spec_per_request_ms * batch) / 1000.0


def prefill_seconds(prompt_tokens: int, params: PerfParams) -> float:
    """Extra time a step pays for the prompts of requests admitted into it."""
    return params.prefill_ms_per_token * prompt_tokens / 1000.0


def step_kind(mode: str, batch: int, spec_disable_threshold: int | None) -> StepKind:
    """Which kind of step the server runs for a running batch of ``batch``.

    Speculative mode falls back to baseline steps while the batch is larger
    than the threshold, like SGLang's dynamic speculative-decoding disable.
    """
    if mode == "baseline":
        return "baseline"
    if mode != "speculative":
        raise ValueError(f"unknown mode {mode!r}: expected one of {', '.join(MODES)}")
    if spec_disable_threshold is not None and batch > spec_disable_threshold:
        return "baseline"
    return "spec"


def step_seconds(kind: StepKind, batch: int, params: PerfParams) -> float:
    if kind == "spec":
        return spec_step_seconds(batch, params)
    return baseline_step_seconds(batch, params)


def tokens_per_step(kind: StepKind, params: PerfParams) -> float:
    """Mean tokens one request gets from one step of this kind."""
    return params.accept_length if kind == "spec" else 1.0


class TokenAccumulator:
    """Turns a fractional mean acceptance length into whole tokens per step.

    Deterministic on purpose: a run is reproducible, and over ``n`` steps a
    request receives ``floor(n * accept_length)`` tokens (never off by more
    than one from the mean), so measured throughput matches the closed form.
    """

    __slots__ = ("_carry",)

    def __init__(self) -> None:
        self._carry = 0.0

    def take(self, kind: StepKind, params: PerfParams) -> int:
        if kind == "baseline":
            return 1
        self._carry += params.accept_length
        # The epsilon keeps e.g. 10 * 0.1-ish float sums from losing a token.
        whole = math.floor(self._carry + 1e-9)
        self._carry -= whole
        return whole


def throughput(
    mode: str,
    concurrency: int,
    params: PerfParams | None = None,
    *,
    spec_disable_threshold: int | None = None,
    max_running_requests: int | None = None,
    prompt_tokens: int = 0,
    output_tokens: int | None = None,
) -> float:
    """Closed-form steady-state output throughput (tokens/s) of the simulator.

    ``concurrency`` clients each keep one request in flight (closed loop), so
    the running batch is ``b = min(concurrency, max_running_requests)``::

        X(b) = b * g / (t(b) + b * g / N * p * P)

    with ``g`` tokens per request per step and ``t(b)`` the step time of the
    step kind chosen for ``b``. The second term amortises prefill: per step
    ``b * g / N`` requests finish and are replaced by new ones whose ``P``
    prompt tokens cost ``p`` each. With ``output_tokens=None`` (infinitely
    long outputs) prefill vanishes, which is the decode-only steady state.
    """
    params = params or PerfParams()
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    batch = concurrency if max_running_requests is None else min(concurrency, max_running_requests)
    kind = step_kind(mode, batch, spec_disable_threshold)
    per_request = tokens_per_step(kind, params)
    step = step_seconds(kind, batch, params)
    if output_tokens is not None and prompt_tokens > 0:
        replaced_per_step = batch * per_request / output_tokens
        step += replaced_per_step * prefill_seconds(prompt_tokens, params)
    return batch * per_request / step


def throughput_table(
    params: PerfParams | None = None,
    concurrencies: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256),
    *,
    spec_disable_threshold: int | None = None,
) -> list[tuple[int, float, float]]:
    """Rows of ``(concurrency, baseline tok/s, speculative tok/s)``."""
    params = params or PerfParams()
    return [
        (
            c,
            throughput("baseline", c, params),
            throughput("speculative", c, params, spec_disable_threshold=spec_disable_threshold),
        )
        for c in concurrencies
    ]


if __name__ == "__main__":  # pragma: no cover - a quick way to eyeball tuning
    for c, base, spec in throughput_table():
        print(f"{c:>4}  baseline {base:7.1f}  speculative {spec:7.1f}  ratio {spec / base:5.3f}")
