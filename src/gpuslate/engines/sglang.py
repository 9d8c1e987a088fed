"""SGLang: ``python -m sglang.launch_server ...`` and ``sglang serve ...``, its adaptive speculative config.

Recommendation: ``--speculative-adaptive --speculative-adaptive-config FILE``,
FILE keyed by batch-size lower bounds: ``{"1": {"candidate_steps": [S]},
"T+1": {"candidate_steps": [0]}}`` with ``S`` the measured
``--speculative-num-steps`` (one candidate: the step count that was measured,
never one SGLang picks by itself), plus a top-level ``candidate_steps`` ``[S]``
that the keyed loader ignores and the flat loader of earlier SGLang refuses at
startup (it needs two values), so an engine that cannot read the keys fails
loudly instead of never switching speculation off.

Blockers: the set-ups its adaptive mode refuses (``adaptive_unsupported_reason``:
an algorithm other than EAGLE/EAGLE3, topk other than 1, attention DP, multi-layer
EAGLE, two-batch overlap, PD multiplexing), falling back to static settings with
one log line, whether the command or the running server (a config file) set them;
and an ambiguous abbreviation (SGLang's argparse refuses it). Sources: docs/experiment.md.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from .args import OptionTable, Style, int_arg, int_or_none, port_arg, scan
from .base import (
    Answers,
    Blocker,
    Counters,
    Emulated,
    Example,
    HttpCall,
    Knob,
    Launch,
    Lifecycle,
    Listening,
    OnTerm,
    Park,
    ParkLevel,
    ParkStyle,
    ReadFile,
    Readiness,
    RunningCheck,
    Shutdown,
    SpecCommand,
    VersionStatus,
    Written,
    abbreviation_notes,
    ambiguity_blockers,
    fact_value,
    threshold_of,
)

NAME = "sglang"
SOURCE = "python/sglang/srt/speculative/adaptive_spec_params.py (adaptive_unsupported_reason)"
PARSER_SOURCE = "python/sglang/srt/server_args.py (argparse, allow_abbrev left at its default)"
ADAPTIVE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN")  # NEXTN: SGLang's server args turn it into EAGLE
CONFIG_FILE = "sglang-adaptive-config.json"
ARGS_FILE = "sglang-args.txt"
MAX_CONFIG_BYTES = 1024 * 1024

#: the options gpuslate reads, and SGLang's others that share their prefixes (server_args.py)
OPTIONS = OptionTable(
    Style.ARGPARSE,
    valued=(("--model-path", "--model"), ("--host",), ("--port",), ("--served-model-name",), ("--api-key",),
            ("--max-running-requests",), ("--config",), ("--tp-size", "--tensor-parallel-size"),
            ("--dp-size", "--data-parallel-size"), ("--pp-size", "--pipeline-parallel-size"),
            ("--speculative-algorithm",), ("--speculative-draft-model-path", "--speculative-draft-model"),
            ("--speculative-draft-model-revision",), ("--speculative-draft-load-format",),
            ("--speculative-draft-model-quantization",), ("--speculative-num-steps",),
            ("--speculative-eagle-topk",), ("--speculative-num-draft-tokens",),
            ("--speculative-accept-threshold-single",), ("--speculative-accept-threshold-acc",),
            ("--speculative-token-map",), ("--speculative-attention-mode",),
            ("--speculative-draft-attention-backend",), ("--speculative-moe-runner-backend",),
            ("--speculative-dflash-block-size",), ("--speculative-adaptive-config",)),
    flags=(("--speculative-adaptive",), ("--enable-dp-attention",), ("--enable-dp-lm-head",),
           ("--enable-multi-layer-eagle",), ("--enable-two-batch-overlap",), ("--enable-pdmux",),
           ("--enable-memory-saver",), ("--enable-weights-cpu-backup",), ("--enable-draft-weights-cpu-backup",)))

#: SGLang's adaptive mode falls back to static settings under these (adaptive_unsupported_reason)
BLOCKING_FLAGS = {
    "--enable-dp-attention": "attention DP: SGLang's adaptive mode does not support it (its per-batch decisions "
                             "are not synchronized across DP ranks) and falls back to static settings",
    "--enable-multi-layer-eagle": "multi-layer EAGLE does not implement the adaptive mode; SGLang falls back to "
                                  "static settings",
    "--enable-two-batch-overlap": "two-batch overlap is not supported by the adaptive mode; SGLang falls back to "
                                  "static settings",
    "--enable-pdmux": "PD multiplexing is not supported by the adaptive mode; SGLang falls back to static settings",
}
#: SGLang's server args that decide whether its adaptive speculative mode applies (recorded per point)
FACTS = ("speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
         "speculative_num_draft_tokens", "speculative_adaptive", "speculative_adaptive_config",
         "enable_dp_attention", "dp_size", "enable_multi_layer_eagle", "enable_two_batch_overlap",
         "enable_pdmux", "pp_size", "enable_memory_saver")
INFO_PATHS = ("/get_server_info", "/server_info")  # /server_info: its newer name
#: its port is bound only once the engine is loaded (http_server.py launch_server: _launch_subprocesses, then
#: uvicorn.run); then its warmup thread sleeps 1 s, asks /get_model_info and sends an 8-token /generate, and only
#: then is the server Up: /health and /health_generate answer 503 while it is Starting (the other routes serve).
#: SIGTERM (tokenizer_manager.py SignalHandler) sets gracefully_exit: the health routes answer 503, every request
#: is still served (generate_request does not look at it), and sigterm_watchdog, which wakes every 5 s, exits
#: once no request is left. A scheduler that dies is seen by SubprocessWatchdog within its 1 s poll: SIGQUIT, the
#: whole process tree killed (the scheduler has no SIGTERM handler: a SIGTERM to every process of the server
#: ends it so, whatever the drain).
LIFECYCLE = Lifecycle(listening=Listening.AFTER_LOAD, shutdown=Shutdown(on_term=OnTerm.DRAIN_SERVING, poll_s=5.0),
                      warmup_s=1.0, warmup_tokens=8, health_paths=("/health", "/health_generate"),
                      worker_watch_s=1.0,
                      source="python/sglang/srt/entrypoints/http_server.py (launch_server, _wait_and_warmup, "
                             "health_generate), python/sglang/srt/managers/tokenizer_manager.py (SignalHandler, "
                             "sigterm_watchdog), python/sglang/srt/managers/scheduler.py (run_scheduler_process), "
                             "SubprocessWatchdog (sgl-project/sglang issue #18421)")


def adaptive_config(steps: int, threshold: int) -> dict[str, Any]:
    """``--speculative-adaptive-config`` for "speculate with ``steps`` while the batch is at most
    ``threshold``": keys are batch-size lower bounds, one candidate each (fixed, not adaptive)."""
    if steps < 1 or threshold < 1:
        raise ValueError(f"steps and threshold must be >= 1, got {steps}, {threshold}")
    return {"_gpuslate": (f"speculate with {steps} steps while the batch is at most {threshold}, not above; the "
                          "top-level candidate_steps is ignored by the batch-size keyed loader and refused by the "
                          "flat loader of earlier SGLang (which would ignore the keys)"),
            "candidate_steps": [steps],
            "1": {"candidate_steps": [steps]},
            str(threshold + 1): {"candidate_steps": [0]}}


_SAVER = ("python/sglang/srt/entrypoints/http_server.py (release_memory_occupation, resume_memory_occupation, "
          "update_weights_from_disk, get_load); managers/scheduler_update_weights_mixin.py")
_RELEASE = HttpCall("POST", "/release_memory_occupation", {})
_RESUME = HttpCall("POST", "/resume_memory_occupation", {})
# torch_memory_saver: no tags release (and resume) kv_cache, weights and cuda_graph. The weights are
# released, not offloaded (#19442): without --enable-weights-cpu-backup (SGLang >= 0.5.3, PR #10873)
# they are loaded again from disk after the resume
PARK = Park(
    style=ParkStyle.RELEASE, flag="--enable-memory-saver", env={},
    levels=(ParkLevel(1, "the weights (kept in CPU memory), the KV cache and the CUDA graphs", park=(_RELEASE,),
                      resume=(_RESUME,), offloads=True, resume_reloads_weights=False,
                      needs_flag="--enable-weights-cpu-backup"),
            ParkLevel(2, "the weights (their content lost), the KV cache and the CUDA graphs", park=(_RELEASE,),
                      resume=(_RESUME, HttpCall("POST", "/update_weights_from_disk", {"model_path": "{model_path}"})),
                      offloads=False, resume_reloads_weights=True, not_with="--enable-weights-cpu-backup")),
    tags=("kv_cache", "weights", "cuda_graph"),
    running=RunningCheck(HttpCall("GET", "/get_load"), keys=("num_reqs",)),
    reload_weights=HttpCall("POST", "/update_weights_from_disk", {"model_path": "{model_path}"}),
    model_option="--model-path",
    source=_SAVER)


class SGLang:
    name = NAME
    title = "SGLang"
    owned_by = "sglang"
    launch = Launch(programs=(("sglang", ("serve",)),), modules=(("sglang.launch_server", ()),))
    options = OPTIONS
    readiness = Readiness(("/health_generate",), "GET /health_generate answers 200 (it runs a 1-token generation)")
    lifecycle = LIFECYCLE
    knobs = (Knob("--speculative-adaptive with batch-size keys in --speculative-adaptive-config",
                  "sgl-project/sglang PR #24055 (2026); the flag itself: PR #21599", None, SOURCE),)
    park = PARK
    counters = Counters(info_path="/get_server_info")
    continuous_usage = True
    probes = INFO_PATHS
    plays_others = False
    reported = NAME
    facts = FACTS
    files = (CONFIG_FILE, ARGS_FILE)

    def delegate(self, argv: tuple[str, ...], start: int) -> tuple[str, int] | None:
        return None

    def read(self, argv: tuple[str, ...], start: int, facts: Mapping[str, Any],
             read_file: ReadFile | None) -> SpecCommand:
        s = scan(argv, start, OPTIONS)
        missing: list[str] = []
        notes = list(abbreviation_notes(s))
        blockers = list(ambiguity_blockers(s, self.title, PARSER_SOURCE))
        algorithm = s.value("--speculative-algorithm") or facts.get("speculative_algorithm")
        algorithm = algorithm if isinstance(algorithm, str) else None
        steps = int_or_none(s.value("--speculative-num-steps"))
        if steps is None and isinstance(facts.get("speculative_num_steps"), int) \
                and not s.has("--speculative-adaptive"):
            steps = facts["speculative_num_steps"]
            notes.append(f"--speculative-num-steps: not in the command; the running server reported {steps} "
                         "(the count SGLang chose), which is what was measured")
        topk_o = s.last("--speculative-eagle-topk")
        topk = int_or_none(topk_o.value) if topk_o else (
            facts["speculative_eagle_topk"] if isinstance(facts.get("speculative_eagle_topk"), int) else None)
        if not algorithm:
            missing.append("--speculative-algorithm: the command runs no speculative decoding")
        if steps is None or steps < 1:
            missing.append("--speculative-num-steps: " + ("not in the command, and the server reported none"
                                                          if steps is None else f"not >= 1 ({steps})")
                           + " (the adaptive config's 'on' side must be the step count that was measured)")
        if algorithm and algorithm.upper() not in ADAPTIVE_ALGORITHMS:
            blockers.append(Blocker(f"--speculative-algorithm {algorithm}",
                                    "SGLang's adaptive mode supports only EAGLE and EAGLE3; with any other algorithm "
                                    "it falls back to static settings with one log line", SOURCE))
        if topk is not None and topk != 1:
            blockers.append(Blocker(f"--speculative-eagle-topk {topk}",
                                    "SGLang's adaptive mode supports only topk 1; with another it falls back to "
                                    "static settings with one log line", SOURCE))
        elif topk is None:
            notes.append("--speculative-eagle-topk: not in the command; the adaptive mode runs topk 1, which may "
                         "not be what SGLang chose for the measured deployment")
        for flag, why in BLOCKING_FLAGS.items():
            if s.has(flag) or facts.get(flag[2:].replace("-", "_")) is True:
                blockers.append(Blocker(flag, why, SOURCE))
        drop = s.spans("--speculative-adaptive", "--speculative-adaptive-config")
        if s.has("--speculative-adaptive"):
            notes.append("the measured deployment already ran --speculative-adaptive: what was measured was not a "
                         "fixed step count (its adaptive config is replaced)")
        if s.has("--config"):
            notes.append("a --config FILE may set more of SGLang's arguments; gpuslate reads only the command line "
                         "(and what the running server reported)")
        return SpecCommand(argv, NAME, steps, algorithm, s.value("--speculative-draft-model-path"), topk, None, None,
                           tuple(missing), tuple(blockers), tuple(notes), tuple(drop), None, start)

    def version_status(self, version: str | None) -> tuple[VersionStatus, str]:
        shown = f"the running SGLang is {version}" if version else "the running SGLang's version was not reported"
        return VersionStatus.UNKNOWN, (
            "SGLang with batch-size keys in --speculative-adaptive-config (they came with sgl-project/sglang PR "
            f"#24055, 2026; the first release that has them is not in the sources gpuslate was built from); {shown}. "
            "An SGLang whose loader reads only a flat candidate_steps refuses this file at startup; one without "
            "--speculative-adaptive refuses the flag")

    def write(self, cmd: SpecCommand, threshold: int, *, top: int, out_dir: str) -> Written:
        assert cmd.k is not None
        args = ("--speculative-adaptive", "--speculative-adaptive-config", str(Path(out_dir).absolute() / CONFIG_FILE))
        return Written(
            {CONFIG_FILE: json.dumps(adaptive_config(cmd.k, threshold), indent=2) + "\n",
             ARGS_FILE: shlex.join(args) + "\n"}, args,
            measured=f"SGLang {cmd.method} with a fixed --speculative-num-steps {cmd.k} against the baseline",
            does=(f"--speculative-adaptive with batch-size keys: {cmd.k} steps (one candidate: SGLang does not change "
                  f"it) for batches of at most {threshold}, 0 steps from {threshold + 1} on"),
            unproven=("SGLang's 0 steps is not the baseline that was measured: it still runs a 1-token target "
                      "verify and the draft model's extend at every step (eagle_worker_v2.py)",
                      "SGLang routes a batch after padding it up to a captured CUDA-graph batch size: a batch of "
                      f"at most {threshold} padded past it runs 0 steps, so the switch is exactly at {threshold} "
                      f"only if {threshold} is a captured size (adaptive_step_router.py)"))

    def reference(self, k: int, threshold: int | None, top: int) -> tuple[str, Any]:
        if threshold == 0:
            return "sglang_adaptive_config", {"1": {"candidate_steps": [0]}}
        if threshold is None:
            return "sglang_adaptive_config", {"1": {"candidate_steps": [k]}}
        return "sglang_adaptive_config", adaptive_config(k, threshold)

    def identify(self, answers: Answers) -> dict[str, Any] | None:
        if answers.owned_by not in (None, self.owned_by):
            return None
        for path in INFO_PATHS:
            doc = answers.doc(path)
            if isinstance(doc, dict) and not doc.get("simulated"):
                version = doc.get("version")
                facts: dict[str, Any] = {"engine": NAME, "version": version if fact_value(version) else None,
                                         "info_path": path}
                facts.update({k: doc[k] for k in FACTS if k in doc and fact_value(doc[k])})
                return facts
        return None

    def emulate(self, argv: Sequence[str], *, version: str | None, max_batch: int,
                read_file: ReadFile) -> Emulated:
        s = scan(tuple(argv), 0, OPTIONS)
        if s.ambiguous:
            written, matches = s.ambiguous[0]
            raise ValueError(f"ambiguous option: {written} could match {', '.join(matches)}")
        port = port_arg(s, 30000)
        running = int_arg(s, "--max-running-requests", None)
        max_batch = running if running is not None else max_batch
        model = s.value("--served-model-name") or s.value("--model-path") or "sim-model"
        algorithm = s.value("--speculative-algorithm")
        if algorithm == "NEXTN":
            algorithm = "EAGLE"
        steps = int_arg(s, "--speculative-num-steps", None)
        topk = int_arg(s, "--speculative-eagle-topk", None)
        info: dict[str, Any] = {
            "speculative_algorithm": algorithm, "speculative_num_steps": steps, "speculative_eagle_topk": topk,
            "speculative_num_draft_tokens": int_arg(s, "--speculative-num-draft-tokens", None),
            "speculative_adaptive": False, "speculative_adaptive_config": s.value("--speculative-adaptive-config"),
            "enable_dp_attention": s.has("--enable-dp-attention"), "model_path": s.value("--model-path"),
            "enable_memory_saver": s.has("--enable-memory-saver"),
            "enable_weights_cpu_backup": s.has("--enable-weights-cpu-backup")}
        plain = Emulated(port, model, s.value("--host"), s.value("--api-key"), running, info=info)
        if algorithm is None:
            return plain
        if not s.has("--speculative-adaptive"):
            return replace(plain, speculative=True)
        reason = None
        if algorithm not in ("EAGLE", "EAGLE3"):
            reason = f"speculative_algorithm={algorithm} (only EAGLE/EAGLE3 are supported)"
        elif topk is not None and topk != 1:
            reason = f"speculative_eagle_topk={topk} (only topk=1 is supported)"
        elif s.has("--enable-dp-attention"):
            reason = "attention DP is not supported (adaptive tier decisions are not synchronized across DP ranks)"
        if reason is not None:
            return replace(plain, speculative=True, warnings=(
                f"speculative_adaptive disabled: {reason}. Falling back to static speculative params.",))
        path = s.value("--speculative-adaptive-config")
        if path is None:
            raise ValueError("SGLang's default adaptive config moves between several step counts by acceptance; the "
                             "simulator does not model that: give --speculative-adaptive-config with one candidate "
                             "a slot")
        slots = keyed_slots(read_file(path))
        keys = sorted(slots)

        def steps_for(batch: int) -> int:
            return slots[max((k for k in keys if k <= batch), default=keys[0])]

        info["speculative_adaptive"] = True
        return replace(plain, speculative=True, threshold=threshold_of(steps_for, max_batch))

    def not_taken(self, facts: Mapping[str, Any]) -> str | None:
        if facts.get("speculative_adaptive") is False:
            return ("the running SGLang reported speculative_adaptive false: it fell back to static settings (see its "
                    "log), so this run is not of the recommendation")
        return None

    def example(self, *, model: str, draft: str, port: int, gpus: int, steps: int, folder: str) -> Example | None:
        base = ("--model-path", model, "--tp-size", str(gpus), "--port", str(port))
        return Example(("-m", "sglang.launch_server"), base, (
            *base, "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", draft,
            "--speculative-num-steps", str(steps), "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", str(steps + 1)), {}, "0.5.11")


def keyed_slots(text: str) -> dict[int, int]:
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


ENGINE = SGLang()
