"""The engines' own rules for the files gpuslate writes, transcribed as facts from their sources
(independently of gpuslate's writer, which the conformance tests hold against them). Read at:

vLLM
  vllm/v1/spec_decode/dynamic/utils.py @ 14b450ca590cbff96e7004bdb147a5d3acf5a4f6:
    validate_and_normalize_dynamic_sd_schedule, build_dynamic_sd_schedule_lookup
  vllm/config/speculative.py @ 002e77c1f0ef9b19cff8b9e21cfbd6feb3d6b443:
    num_speculative_tokens: Field(gt=0); "num_speculative_tokens was provided but without
    speculative model" (neither method nor model)
  docs/features/speculative_decoding/dynamic_speculative_decoding.md @ 015a47e1282c9ef40d706ee3463cb699e04e93c0:
    "Every optimal_K must be less than or equal to num_speculative_tokens"; disabled with
    --data-parallel-size > 1
SGLang
  python/sglang/srt/speculative/adaptive_spec_params.py @ 015c872628e328b530880bcf95ae91222604b225:
    _load_adaptive_config (the batch-size keyed loader), AdaptiveStepSlot
  python/sglang/srt/speculative/adaptive_step_router.py @ a12239f6ac74d804d169ee5d3cfed3c49fa7162c:
    batch_size_key_for_batch
  the flat loader before the keys (sgl-project/sglang PR #21599's AdaptiveSpeculativeParams):
    candidates = set(cfg.get("candidate_steps", [1, 3, 7])) (+ the initial steps in later ones),
    assert len(candidates) >= 2
TensorRT-LLM
  tensorrt_llm/llmapi/llm_args.py (DecodingBaseConfig, the stored version read):
    validate_draft_len_schedule_and_sort: keys >= 1, values >= 0, the smallest key's value must equal
    max_draft_len, every value <= max_draft_len; the earlier validator (PR #8194): the schedule must
    include batch_size=1 and schedule[1] == max_draft_len; max_concurrency and draft_len_schedule are
    mutually exclusive (the model validator); speculative configs are StrictBaseModels (unknown keys refused)
  tensorrt_llm/_torch/speculative/drafter.py (PR #8194, stage 1): get_draft_len_for_batch_size, the value
    of the largest key <= batch size (keys as lower bounds)
  tensorrt_llm/_torch/speculative/utils.py (PR #10860, "New semantics"): get_draft_len_for_batch_size,
    the value of the first key >= batch size; above every key, 0 (speculation disabled)
Parsers
  CPython's argparse (3.11) _parse_optional / _get_option_tuples: with allow_abbrev (the default), a long
    option given as a prefix of option strings is that option when it matches one, "ambiguous option:
    --x could match --a, --b" when it matches several (each alias counts); '--x=v' takes the prefix before '='
  click/parser.py _match_long_opt: whole names only; anything else is NoSuchOption (trtllm-serve)
"""

from __future__ import annotations

import bisect
from typing import Any

CTX_INFINITY = 2**31 - 1


# -- vLLM ----------------------------------------------------------------------------------


def vllm_validate_schedule(schedule: object) -> list[tuple[int, int, int, int, int]]:
    if schedule is None:
        raise ValueError("speculative_token_schedule is required")
    if not isinstance(schedule, list):
        raise ValueError("must be a non-empty list")
    if not schedule:
        raise ValueError("must not be empty")
    arities, parsed = set(), []
    for entry in schedule:
        if not isinstance(entry, (list, tuple)) or len(entry) not in (3, 5):
            raise ValueError("3-item or 5-item sequence")
        arities.add(len(entry))
        if len(entry) == 3:
            lo, hi, k = int(entry[0]), int(entry[1]), int(entry[2])
            clo, chi = 1, CTX_INFINITY
        else:
            lo, hi, clo, chi, k = (int(x) for x in entry)
        if lo <= 0 or hi <= 0:
            raise ValueError("Batch-size range must be positive")
        if lo > hi:
            raise ValueError("Batch-size range start must be <= end")
        if clo <= 0 or chi <= 0 or clo > chi:
            raise ValueError("Context range")
        if k < 0:
            raise ValueError("K values must be >= 0")
        parsed.append((lo, hi, clo, chi, k))
    if len(arities) > 1:
        raise ValueError("mixing the two forms")
    ranges = sorted({(lo, hi) for lo, hi, *_ in parsed})
    prev = 0
    for lo, hi in ranges:
        if lo <= prev:
            raise ValueError("Batch-size ranges must be non-overlapping and sorted.")
        prev = hi
    if ranges[0][0] != 1:
        raise ValueError("The first batch-size range must start at 1")
    ctx = sorted({(clo, chi) for _, _, clo, chi, _ in parsed})
    if len(parsed) != len(ranges) * len(ctx):
        raise ValueError("rectangular grid")
    return sorted(parsed, key=lambda e: (e[0], e[2]))


def vllm_lookup(schedule: object, max_batch: int, num_speculative_tokens: int) -> list[int]:
    """The dense batch_size -> K (one context bucket, the 3-item form): index 0 unused."""
    if max_batch <= 0 or num_speculative_tokens <= 0:
        raise ValueError("must be > 0")
    entries = [(lo, hi, k) for lo, hi, _, _, k in vllm_validate_schedule(schedule)]
    dense = [0] * (max_batch + 1)
    nxt, last = 1, None
    for lo, hi, k in sorted(entries):
        if lo > nxt and last is not None:
            for b in range(nxt, min(lo, max_batch + 1)):
                dense[b] = min(num_speculative_tokens, last)
        for b in range(max(lo, nxt), min(hi, max_batch) + 1):
            dense[b] = min(num_speculative_tokens, k)
        nxt, last = max(nxt, hi + 1), k
        if nxt > max_batch:
            break
    if last is not None:
        for b in range(nxt, max_batch + 1):
            dense[b] = min(num_speculative_tokens, last)
    return dense


def vllm_check_config(cfg: object) -> None:
    """What SpeculativeConfig and the Dynamic SD docs ask of a --speculative-config with a schedule."""
    if not isinstance(cfg, dict):
        raise ValueError("not an object")
    k = cfg.get("num_speculative_tokens")
    if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
        raise ValueError("num_speculative_tokens must be > 0")
    if cfg.get("method") is None and cfg.get("model") is None:
        raise ValueError("num_speculative_tokens was provided but without speculative model")
    for entry in vllm_validate_schedule(cfg["num_speculative_tokens_per_batch_size"]):
        if entry[4] > k:
            raise ValueError("Every optimal_K must be less than or equal to num_speculative_tokens")


# -- SGLang --------------------------------------------------------------------------------


def sglang_keyed_slots(cfg: object) -> dict[int, list[int]]:
    """The keyed loader: digit keys (others skipped), candidate_steps a non-empty list of ints
    >= 0, at least one key; a slot's candidates are sorted(set(...))."""
    if not isinstance(cfg, dict):
        raise ValueError("must be a JSON object")
    strategy = cfg.get("strategy", "ema")
    if strategy not in ("ema", "throughput_aware"):
        raise ValueError("strategy")
    slots = {}
    for key, entry in cfg.items():
        if not key.isdigit():
            continue
        steps = entry.get("candidate_steps")
        if not isinstance(steps, list) or not steps or not all(isinstance(s, int) and s >= 0 for s in steps):
            raise ValueError(f"BS {key}: candidate_steps must be a list of non-negative ints")
        slots[int(key)] = sorted(set(steps))
    if not slots:
        raise ValueError("must contain at least one integer-string BS key")
    return slots


def sglang_initial_steps(candidates: list[int], initial: int) -> int:
    """AdaptiveStepSlot: the initial --speculative-num-steps if a candidate, else the middle one."""
    return initial if initial in candidates else candidates[len(candidates) // 2]


def sglang_route(slots: dict[int, list[int]], batch: int, cuda_graph_bs: list[int] | None = None) -> int:
    """batch_size_key_for_batch: pad to the next captured size, then the largest key not above it."""
    if cuda_graph_bs:
        graphs = sorted(cuda_graph_bs)
        i = bisect.bisect_left(graphs, batch)
        if i < len(graphs):
            batch = graphs[i]
    keys = sorted(slots)
    return keys[max(0, bisect.bisect_right(keys, batch) - 1)]


def sglang_flat_loader(cfg: dict[str, Any], initial: int, *, add_initial: bool) -> list[int]:
    """The loader before the keys: one flat candidate_steps (default [1, 3, 7]), keys ignored."""
    candidates = set(cfg.get("candidate_steps", [1, 3, 7]))
    if add_initial:
        candidates.add(initial)
    if len(candidates) < 2:
        raise AssertionError("candidate_steps must have at least 2 distinct values")
    return sorted(candidates)


# -- TensorRT-LLM -------------------------------------------------------------------------


def trtllm_validate(schedule: object, max_draft_len: int) -> dict[int, int]:
    """Both validators TensorRT-LLM has had; a schedule gpuslate writes must pass them both."""
    if not isinstance(schedule, dict) or not schedule:
        raise ValueError("draft_len_schedule must be a mapping")
    sched = {int(k): v for k, v in schedule.items()}
    for b, d in sched.items():
        if b < 1:
            raise ValueError("batch size threshold must be >= 1")
        if not isinstance(d, int) or isinstance(d, bool) or d < 0:
            raise ValueError("draft length must be >= 0")
        if d > max_draft_len:
            raise ValueError("all draft lengths must be <= max_draft_len")
    if sched[min(sched)] != max_draft_len:  # the current validator
        raise ValueError("draft_len_schedule[smallest] must equal max_draft_len")
    if 1 not in sched or sched[1] != max_draft_len:  # the validator of PR #8194
        raise ValueError("draft_len_schedule must include batch_size=1 with max_draft_len")
    return dict(sorted(sched.items()))


def trtllm_lookup(schedule: dict[int, int], batch: int, rule: str) -> int:
    """``upper`` (PR #10860): the first key >= batch, above all keys 0; ``lower`` (PR #8194): the
    largest key <= batch."""
    keys = sorted(schedule)
    if rule == "upper":
        i = bisect.bisect_left(keys, batch)
        return schedule[keys[i]] if i < len(keys) else 0
    i = bisect.bisect_right(keys, batch)
    return schedule[keys[i - 1]] if i > 0 else 0


def trtllm_check_config(spec: dict[str, Any]) -> None:
    if spec.get("max_concurrency") is not None and spec.get("draft_len_schedule") is not None:
        raise ValueError("max_concurrency and draft_len_schedule are mutually exclusive")


# -- parsers -------------------------------------------------------------------------------


def argparse_resolve(option_strings: list[str], given: str) -> str:
    """What CPython's argparse makes of a long option ``given`` (before any '='), with abbreviations on."""
    name = given.partition("=")[0]
    if name in option_strings:
        return name
    matches = [s for s in option_strings if s.startswith(name)]
    if len(matches) > 1:
        raise ValueError(f"ambiguous option: {name} could match {', '.join(matches)}")
    if not matches:
        raise KeyError(name)
    return matches[0]


def click_resolve(option_strings: list[str], given: str) -> str:
    name = given.partition("=")[0]
    if name not in option_strings:
        raise KeyError(f"No such option: {name}")
    return name
