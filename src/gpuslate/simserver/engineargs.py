"""``sim serve --emulate vllm|sglang -- ARGS``: the simulated server taking an engine's own arguments.

So that an experiment can declare a deployment exactly as it would run it on
GPUs (``vllm serve MODEL --speculative-config '{...}'``, ``python -m
sglang.launch_server ... --speculative-algorithm EAGLE3``) and run it on a
machine without GPUs, the simulator reads the engine's arguments the way the
engine does, applying the engine's own rules, and maps them onto its model:
speculation on or off per batch size, i.e. ``--spec-disable-threshold``.
A configuration the engine would refuse is refused (one line, exit 2); one
the engine would ignore is ignored with the engine's own warning line.

Rules followed (the sources are cited in docs/experiment.md):

* vLLM: ``--speculative-config`` JSON with ``num_speculative_tokens`` > 0 and
  ``num_speculative_tokens_per_batch_size`` entries ``[lo, hi, K]`` (positive,
  ``lo <= hi``, ``K >= 0``, sorted, non-overlapping, the first starting at 1;
  a gap takes the K before it, batches past the last range the last K, every
  K capped at ``num_speculative_tokens``); ``--data-parallel-size`` > 1
  disables the schedule (the static K then applies); a vLLM below 0.25
  (``--engine-version``) has no such key and refuses it. ``--foo_bar`` is
  ``--foo-bar``.
* SGLang: ``--speculative-algorithm`` (``NEXTN`` is ``EAGLE``),
  ``--speculative-adaptive`` with ``--speculative-adaptive-config``: integer-
  string keys, batch-size lower bounds, each ``candidate_steps`` a non-empty
  list of ints >= 0; a batch takes the slot of the largest key not above it;
  adaptive mode falls back to static settings (a warning line) with an
  algorithm other than EAGLE/EAGLE3, ``--speculative-eagle-topk`` other than
  1, or ``--enable-dp-attention``.

Not modelled (refused with a line saying so): a slot of several candidate
steps (SGLang's EMA moves between them), a schedule whose K goes from 0 back
up, vLLM's 5-item (context-length) entries. Every positive K or step count is
the model's one speculative step: ``--accept-length`` stays what it is.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

EMULATED = ("vllm", "sglang")
VLLM_FIRST_SCHEDULE = (0, 25)
MAX_CONFIG_BYTES = 1024 * 1024


@dataclass(frozen=True)
class EngineSettings:
    """What the engine's arguments set on the simulated server."""

    values: dict[str, Any]  # ServerConfig fields: host, port, model, mode, spec_disable_threshold, api_key, ...
    info: dict[str, Any] = field(default_factory=dict)  # the engine's own facts for /get_server_info
    warnings: tuple[str, ...] = ()  # the engine's log lines about what it ignored or disabled


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # never exit from inside the server's config
        raise ValueError(message)


def settings(engine: str, argv: Sequence[str], *, version: str | None, max_batch: int,
             read_file: Callable[[str], str]) -> EngineSettings:
    """The simulated server's settings from ``engine``'s command-line arguments (after the program).
    ``read_file`` reads a file the arguments name (SGLang's adaptive config). ValueError: refused."""
    if engine == "vllm":
        return _vllm(list(argv), version, max_batch)
    if engine == "sglang":
        return _sglang(list(argv), max_batch, read_file)
    raise ValueError(f"--emulate must be one of {', '.join(EMULATED)}, got {engine!r}")


def threshold_of(k_of: Callable[[int], int], max_batch: int) -> int | None:
    """The simulator's threshold for a per-batch-size step count: speculate while the batch is at
    most T, not above (None: at every batch size). ValueError for any other shape."""
    on = [k_of(b) > 0 for b in range(1, max_batch + 1)]
    last_on = max((b for b, s in enumerate(on, 1) if s), default=0)
    if not all(on[:last_on]):
        raise ValueError("the simulator models speculation up to one batch size and not above; this schedule "
                         "turns it off and on again")
    return None if last_on == max_batch else last_on


def _served(a: argparse.Namespace, model: str, max_running: int | None) -> dict[str, Any]:
    """The ServerConfig fields both engines' flags set the same way: where it listens, the model's
    name, the API key, and the engine's cap on running requests (vLLM --max-num-seqs, SGLang
    --max-running-requests)."""
    values: dict[str, Any] = {"port": a.port, "model": model}
    for key in ("host", "api_key"):
        if getattr(a, key) is not None:
            values[key] = getattr(a, key)
    if max_running is not None:
        values["max_running_requests"] = max_running
    return values


def _vllm(argv: list[str], version: str | None, max_batch: int) -> EngineSettings:
    argv = [re.sub(r"^(--[^=]*)", lambda m: m.group(1).replace("_", "-"), a) if a.startswith("--") else a
            for a in argv]
    if argv[:1] == ["serve"]:
        argv = argv[1:]
    p = _Parser(prog="vllm serve", allow_abbrev=False, add_help=False)
    p.add_argument("model_tag", nargs="?")
    p.add_argument("--model")
    p.add_argument("--host")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", nargs="+")
    p.add_argument("--api-key")
    p.add_argument("--speculative-config")
    p.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--enable-sleep-mode", action="store_true")  # the park endpoints (simserver/park.py)
    p.add_argument("--enforce-eager", action="store_true")  # no CUDA graphs
    a, _ = p.parse_known_args(argv)
    model = (a.served_model_name or [None])[0] or a.model_tag or a.model or "sim-model"
    values = _served(a, model, a.max_num_seqs)
    max_batch = a.max_num_seqs if a.max_num_seqs is not None else max_batch
    info: dict[str, Any] = {"data_parallel_size": a.data_parallel_size, "enable_sleep_mode": a.enable_sleep_mode,
                            "enforce_eager": a.enforce_eager}
    warnings: list[str] = []
    if a.speculative_config is None:
        return EngineSettings(values, info)
    if len(a.speculative_config.encode()) > MAX_CONFIG_BYTES:
        raise ValueError("--speculative-config is too large")
    try:
        cfg = json.loads(a.speculative_config)
    except ValueError as exc:
        raise ValueError(f"--speculative-config is not JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise ValueError("--speculative-config must be a JSON object")
    k = cfg.get("num_speculative_tokens")
    if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
        raise ValueError(f"Expected num_speculative_tokens to be greater than zero ({k})")
    if cfg.get("method") is None and cfg.get("model") is None:
        raise ValueError("num_speculative_tokens was provided but without speculative model")
    values["mode"] = "speculative"
    info["speculative_config"] = cfg
    schedule = cfg.get("num_speculative_tokens_per_batch_size")
    if schedule is not None:
        m = re.match(r"v?(\d+)\.(\d+)", version or "")
        if m and (int(m.group(1)), int(m.group(2))) < VLLM_FIRST_SCHEDULE:
            raise ValueError(f"SpeculativeConfig has no field 'num_speculative_tokens_per_batch_size' (vLLM {version})")
        entries = _vllm_schedule(schedule)
        if a.data_parallel_size > 1:
            warnings.append("Dynamic speculative decoding is not supported with data parallelism; "
                            "disabling num_speculative_tokens_per_batch_size and using the static "
                            f"num_speculative_tokens={k}")
        else:
            values["spec_disable_threshold"] = threshold_of(lambda b: _vllm_k(entries, b, k), max_batch)
    return EngineSettings(values, info, tuple(warnings))


def _vllm_schedule(schedule: object) -> list[tuple[int, int, int]]:
    if not isinstance(schedule, list) or not schedule:
        raise ValueError("num_speculative_tokens_per_batch_size must be a non-empty list of 3-item entries")
    out = []
    for entry in schedule:
        if not isinstance(entry, (list, tuple)) or len(entry) not in (3, 5):
            raise ValueError("Each entry must be a 3-item sequence (bs_lo, bs_hi, num_speculative_tokens)")
        if len(entry) == 5:
            raise ValueError("5-item (context-length) entries are not modelled by the simulator")
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in entry):
            raise ValueError(f"schedule entries must be integers, got {entry!r}")
        lo, hi, k = entry
        if lo <= 0 or hi <= 0:
            raise ValueError(f"Batch-size range ({lo}, {hi}) must be positive.")
        if lo > hi:
            raise ValueError(f"Batch-size range start must be <= end for ({lo}, {hi}, {k}).")
        if k < 0:
            raise ValueError("num_speculative_tokens_per_batch_size K values must be >= 0.")
        out.append((lo, hi, k))
    out.sort()
    prev = 0
    for lo, hi, _ in out:
        if lo <= prev:
            raise ValueError("Batch-size ranges must be non-overlapping and sorted.")
        prev = hi
    if out[0][0] != 1:
        raise ValueError("The first batch-size range must start at 1 so every runtime batch size has a defined "
                         "schedule.")
    return out


def _vllm_k(entries: list[tuple[int, int, int]], batch: int, k_max: int) -> int:
    """vLLM's dense lookup: the range holding the batch, else the K of the last range before it."""
    k = entries[0][2]
    for lo, _hi, kk in entries:
        if lo > batch:
            break
        k = kk
    return min(k_max, k)


def _sglang(argv: list[str], max_batch: int, read_file: Callable[[str], str]) -> EngineSettings:
    p = _Parser(prog="sglang.launch_server", add_help=False)  # argparse's abbreviations, as SGLang
    p.add_argument("--model-path", "--model")
    p.add_argument("--host")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--served-model-name")
    p.add_argument("--api-key")
    p.add_argument("--speculative-algorithm")
    p.add_argument("--speculative-draft-model-path", "--speculative-draft-model")
    p.add_argument("--speculative-num-steps", type=int)
    p.add_argument("--speculative-eagle-topk", type=int)
    p.add_argument("--speculative-num-draft-tokens", type=int)
    p.add_argument("--speculative-adaptive", action="store_true")
    p.add_argument("--speculative-adaptive-config")
    p.add_argument("--enable-dp-attention", action="store_true")
    p.add_argument("--max-running-requests", type=int)
    p.add_argument("--enable-memory-saver", action="store_true")  # the park endpoints (simserver/park.py)
    p.add_argument("--enable-weights-cpu-backup", action="store_true")  # released weights kept in CPU memory
    a, _ = p.parse_known_args(argv)
    model = a.served_model_name or a.model_path or "sim-model"
    values = _served(a, model, a.max_running_requests)
    max_batch = a.max_running_requests if a.max_running_requests is not None else max_batch
    algorithm = a.speculative_algorithm
    if algorithm == "NEXTN":
        algorithm = "EAGLE"
    info: dict[str, Any] = {"speculative_algorithm": algorithm, "speculative_num_steps": a.speculative_num_steps,
                            "speculative_eagle_topk": a.speculative_eagle_topk,
                            "speculative_num_draft_tokens": a.speculative_num_draft_tokens,
                            "speculative_adaptive": False, "speculative_adaptive_config": a.speculative_adaptive_config,
                            "enable_dp_attention": a.enable_dp_attention, "model_path": a.model_path,
                            "enable_memory_saver": a.enable_memory_saver,
                            "enable_weights_cpu_backup": a.enable_weights_cpu_backup}
    warnings: list[str] = []
    if algorithm is None:
        return EngineSettings(values, info)
    values["mode"] = "speculative"
    if not a.speculative_adaptive:
        return EngineSettings(values, info)
    reason = None
    if algorithm not in ("EAGLE", "EAGLE3"):
        reason = f"speculative_algorithm={algorithm} (only EAGLE/EAGLE3 are supported)"
    elif a.speculative_eagle_topk is not None and a.speculative_eagle_topk != 1:
        reason = f"speculative_eagle_topk={a.speculative_eagle_topk} (only topk=1 is supported)"
    elif a.enable_dp_attention:
        reason = "attention DP is not supported (adaptive tier decisions are not synchronized across DP ranks)"
    if reason is not None:
        warnings.append(f"speculative_adaptive disabled: {reason}. Falling back to static speculative params.")
        return EngineSettings(values, info, tuple(warnings))
    if a.speculative_adaptive_config is None:
        raise ValueError("SGLang's default adaptive config moves between several step counts by acceptance; the "
                         "simulator does not model that: give --speculative-adaptive-config with one candidate a slot")
    slots = _sglang_slots(read_file(a.speculative_adaptive_config))
    keys = sorted(slots)

    def steps_for(batch: int) -> int:
        key = max((k for k in keys if k <= batch), default=keys[0])
        return slots[key]

    info["speculative_adaptive"] = True
    values["spec_disable_threshold"] = threshold_of(steps_for, max_batch)
    return EngineSettings(values, info, tuple(warnings))


def _sglang_slots(text: str) -> dict[int, int]:
    """SGLang's batch-size keyed loader: integer-string keys (others are global settings), each
    ``candidate_steps`` a non-empty list of ints >= 0, at least one key."""
    if len(text.encode()) > MAX_CONFIG_BYTES:
        raise ValueError("the adaptive config is too large")
    try:
        cfg = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"the adaptive config is not JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"speculative adaptive config must be a JSON object, got {type(cfg).__name__}")
    slots: dict[int, int] = {}
    for key, entry in cfg.items():
        if not key.isdigit():
            continue
        steps = entry.get("candidate_steps") if isinstance(entry, dict) else None
        if not isinstance(steps, list) or not steps or not all(
                isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in steps):
            raise ValueError(f"BS {key}: candidate_steps must be a list of non-negative ints, got {steps!r}")
        if len(set(steps)) != 1:
            raise ValueError(f"BS {key}: candidate_steps {steps}: SGLang moves between these by acceptance, which "
                             "the simulator does not model (give one value a slot)")
        slots[int(key)] = steps[0]
    if not slots:
        raise ValueError("speculative_adaptive_config must contain at least one integer-string BS key, "
                         f"e.g. {{\"1\": {{\"candidate_steps\": [1,3,7]}}}}. Got keys: {list(cfg)}")
    return slots
