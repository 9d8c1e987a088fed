"""vLLM: ``vllm serve MODEL ...`` (and its Python module forms), its ``--speculative-config``.

Recommendation: the command's ``--speculative-config`` JSON (or the older
``--speculative-model`` / ``--num-speculative-tokens`` flags, turned into that
JSON), its method, model, K and every other key kept, with
``num_speculative_tokens_per_batch_size`` ``[[1, T, K], [T + 1, ..., 0]]``
added: ``vllm-speculative-config.json`` and the command line with it.

vLLM parses its command with ``FlexibleArgumentParser``, an argparse parser
that keeps argparse's default ``allow_abbrev=True`` (vllm/utils/argparse_utils.py;
the ``serve`` subparser is made by ``add_parser`` without changing it), after
turning ``_`` into ``-`` in option names: ``--speculative_conf`` is
``--speculative-config``, an ambiguous prefix (``--data-parallel-siz``: also
``--data-parallel-size-local``) makes it refuse the command. Blockers:
``--data-parallel-size`` > 1 (vLLM disables the schedule). Sources: docs/experiment.md.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from .args import OptionTable, Scan, Style, int_arg, int_or_none, port_arg, scan
from .base import (
    Answers,
    Blocker,
    Counters,
    Emulated,
    Example,
    HazardEffect,
    HttpCall,
    Knob,
    Launch,
    Lifecycle,
    Listening,
    OnTerm,
    Park,
    ParkHazard,
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
    version_tuple,
)

NAME = "vllm"
FIRST_SCHEDULE = (0, 25)  # the first release whose documentation has Dynamic SD
SOURCE = "vllm/v1/spec_decode/dynamic/utils.py, docs/features/speculative_decoding/dynamic_speculative_decoding.md"
PARSER_SOURCE = "vllm/utils/argparse_utils.py (FlexibleArgumentParser: argparse, allow_abbrev left at its default)"
CONFIG_FILE = "vllm-speculative-config.json"
MAX_CONFIG_BYTES = 64 * 1024  # a --speculative-config larger than this is not read

# older vLLM flags (before --speculative-config) -> the key they became
OLD_FLAGS = {
    "--speculative-model": "model", "--num-speculative-tokens": "num_speculative_tokens",
    "--speculative-draft-tensor-parallel-size": "draft_tensor_parallel_size",
    "--speculative-max-model-len": "max_model_len", "--ngram-prompt-lookup-max": "prompt_lookup_max",
    "--ngram-prompt-lookup-min": "prompt_lookup_min", "--speculative-disable-by-batch-size": "disable_by_batch_size",
}
INT_KEYS = {"num_speculative_tokens", "draft_tensor_parallel_size", "max_model_len", "prompt_lookup_max",
            "prompt_lookup_min", "disable_by_batch_size"}

#: the options gpuslate reads, and vLLM's others that share their prefixes (vllm/engine/arg_utils.py)
OPTIONS = OptionTable(
    Style.ARGPARSE,
    valued=(("--model",), ("--host",), ("--port",), ("--served-model-name",), ("--api-key",),
            ("--speculative-config",), ("--data-parallel-size",), ("--data-parallel-size-local",),
            ("--data-parallel-rank",), ("--data-parallel-start-rank",), ("--data-parallel-address",),
            ("--data-parallel-rpc-port",), ("--data-parallel-backend",), ("--max-num-seqs",),
            ("--max-num-batched-tokens",), ("--max-model-len",), ("--config",), ("--tensor-parallel-size",),
            ("--pipeline-parallel-size",), ("--shutdown-mode",), ("--shutdown-drain-timeout",),
            *((flag,) for flag in OLD_FLAGS)),
    flags=(("--enable-sleep-mode",), ("--enforce-eager",), ("--data-parallel-hybrid-lb",),
           ("--data-parallel-external-lb",), ("--headless",)),
    short=(("-dp", "--data-parallel-size"), ("-dpl", "--data-parallel-size-local"),
           ("-tp", "--tensor-parallel-size"), ("-pp", "--pipeline-parallel-size")),
    underscores=True, dotted=True)

#: --shutdown-mode drain: SIGTERM drains for at most --shutdown-drain-timeout (FrontendArgs' default)
DRAIN_MODE = ("--shutdown-mode", "drain")
DRAIN_TIMEOUT_S = 120.0
#: its port is bound, not listened on, before the engine is built (api_server.py setup_server: "bind the port
#: before the engine is set up"); uvicorn listens once the engine serves: connections are refused until then.
#: SIGTERM (launcher.py serve_http) cancels the server at once; with --shutdown-mode drain every route but /live
#: and /metrics answers 503 (serve/middleware.py) while the requests in flight finish, for at most
#: --shutdown-drain-timeout. An engine core's death is seen at once (core_client.py: its process sentinel,
#: "Engine core proc ... died unexpectedly, shutting down client").
LIFECYCLE = Lifecycle(listening=Listening.BOUND_REFUSING, shutdown=Shutdown(on_term=OnTerm.IMMEDIATE),
                      health_paths=("/health",), worker_watch_s=0.0,
                      source="vllm/entrypoints/openai/api_server.py (setup_server, build_and_serve), "
                             "vllm/entrypoints/launcher.py (serve_http, graceful_drain), "
                             "vllm/entrypoints/serve/middleware.py, docs/deployment/k8s.md (Drain Shutdown)")


def schedule(k: int, threshold: int, top: int) -> list[list[int]]:
    """``num_speculative_tokens_per_batch_size``: K up to ``threshold``, 0 above (the last range's K
    holds for every larger batch, so its end, the larger of ``top`` and T+1, bounds nothing)."""
    if k < 1 or threshold < 1:
        raise ValueError(f"K and threshold must be >= 1, got {k}, {threshold}")
    return [[1, threshold, k], [threshold + 1, max(threshold + 1, top), 0]]


_SLEEP = "vllm/entrypoints/serve/sleep/api_router.py; v1/worker/gpu_worker.py; docs/features/sleep_mode.md"
# the routes exist only with VLLM_SERVER_DEV_MODE=1. A sleep pauses the scheduler first by ``mode``
# (vLLM 0.26; ``wait``: what runs finishes, what arrives waits; older releases ignore the parameter);
# level 1 copies the weights into CPU memory, level 2 drops them: its wake maps the weights back empty,
# reloads them (collective_rpc reload_weights), then wakes the KV cache
PARK = Park(
    style=ParkStyle.SLEEP, flag="--enable-sleep-mode", env={"VLLM_SERVER_DEV_MODE": "1"},
    levels=(ParkLevel(1, "the weights (offloaded to CPU memory) and the KV cache",
                      park=(HttpCall("POST", "/sleep?level=1&mode=wait"),), resume=(HttpCall("POST", "/wake_up"),),
                      offloads=True, resume_reloads_weights=False),
            ParkLevel(2, "the weights and the KV cache (the weights' content is lost)",
                      park=(HttpCall("POST", "/sleep?level=2&mode=wait"),),
                      resume=(HttpCall("POST", "/wake_up?tags=weights"),
                              HttpCall("POST", "/collective_rpc", {"method": "reload_weights"}),
                              HttpCall("POST", "/wake_up?tags=kv_cache")),
                      offloads=False, resume_reloads_weights=True)),
    tags=("weights", "kv_cache"),
    running=RunningCheck(HttpCall("GET", "/metrics"),
                         prometheus=("vllm:num_requests_running", "vllm:num_requests_waiting")),
    status=HttpCall("GET", "/is_sleeping"),
    reload_weights=HttpCall("POST", "/collective_rpc", {"method": "reload_weights"}),
    hazards=(
        ParkHazard(HazardEffect.FAULTS_AFTER_RESUME,
                   "EAGLE/EAGLE3 with CUDA graphs: the draft's multi-step CUDA graph replays into freed memory after "
                   "a level-2 wake (illegal memory access)", "vLLM #55013", levels=(2,), methods=("eagle", "eagle3"),
                   unless_flag="--enforce-eager"),
        ParkHazard(HazardEffect.FREES_NOTHING,
                   "with PyTorch's expandable segments the sleep allocator's pools track nothing: a sleep answers 200 "
                   "and frees nothing (\"freed 0.00 GiB\")", "vLLM PR #11743",
                   env=("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:true"))),
    source=_SLEEP)


class VLLM:
    name = NAME
    title = "vLLM"
    owned_by = "vllm"
    launch = Launch(programs=(("vllm", ("serve",)),),
                    modules=(("vllm.entrypoints.openai.api_server", ()), ("vllm.entrypoints.api_server", ()),
                             ("vllm.entrypoints.cli.main", ("serve",))))
    options = OPTIONS
    readiness = Readiness(("/health", "/v1/models"), "GET /health, then GET /v1/models, answer 200")
    lifecycle = LIFECYCLE
    knobs = (Knob("num_speculative_tokens_per_batch_size", "Dynamic speculative decoding (2026)", FIRST_SCHEDULE,
                  SOURCE),)
    park = PARK
    counters = Counters(prometheus=("vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_drafts_total"))
    continuous_usage = True
    probes = ("/version",)
    plays_others = False
    reported = NAME
    facts = ()
    files = (CONFIG_FILE,)

    def delegate(self, argv: tuple[str, ...], start: int) -> tuple[str, int] | None:
        return None

    def read(self, argv: tuple[str, ...], start: int, facts: Mapping[str, Any],
             read_file: ReadFile | None) -> SpecCommand:
        s = scan(argv, start, OPTIONS)
        missing: list[str] = []
        notes = list(abbreviation_notes(s))
        blockers = list(ambiguity_blockers(s, self.title, PARSER_SOURCE))
        drop: list[tuple[int, int]] = []
        config: dict[str, Any] | None = None
        insert_at = None
        dotted = [d for d in s.dotted if d.startswith("--speculative-config.")]
        opt = s.last("--speculative-config")
        old = {flag: o for flag in OLD_FLAGS if (o := s.last(flag)) is not None}
        if dotted:
            missing.append(f"{dotted[0]}: vLLM's dotted --speculative-config.KEY arguments are not read by "
                           "gpuslate; give the whole --speculative-config JSON")
        if opt is not None:
            drop += s.spans("--speculative-config")
            insert_at = opt.span[0]
            if opt.value is None:
                missing.append("--speculative-config has no value")
            elif len(opt.value.encode()) > MAX_CONFIG_BYTES:
                missing.append(f"--speculative-config is over {MAX_CONFIG_BYTES} bytes")
            else:
                try:
                    parsed = json.loads(opt.value)
                except ValueError as exc:
                    missing.append(f"--speculative-config is not JSON ({exc})")
                else:
                    if isinstance(parsed, dict):
                        config = parsed
                    else:
                        missing.append("--speculative-config is not a JSON object")
            if old:
                missing.append(f"both --speculative-config and the older {', '.join(old)}: vLLM takes one or the "
                               "other")
        elif old:
            config = {}
            for flag, o in old.items():
                drop += s.spans(flag)
                key = OLD_FLAGS[flag]
                value = int_or_none(o.value) if key in INT_KEYS else o.value
                if value is None:
                    missing.append(f"{flag} has no usable value ({o.value!r})")
                else:
                    config[key] = value
            insert_at = min(lo for lo, _ in drop)
            notes.append("the command uses vLLM's older flags (" + ", ".join(old) + "): gpuslate writes the "
                         "--speculative-config they stand for, which newer vLLM takes instead")
        elif not dotted:
            if s.has("--config"):
                missing.append("--speculative-config: not in the command (a --config FILE may hold it; gpuslate "
                               "does not read that file): put the speculative config on the command line")
            else:
                missing.append("--speculative-config: the command runs no speculative decoding")
        k = method = draft = None
        if config is not None:
            k_raw = config.get("num_speculative_tokens")
            if isinstance(k_raw, bool) or not isinstance(k_raw, int) or k_raw < 1:
                missing.append("num_speculative_tokens: the speculative config has no K >= 1 "
                               f"({k_raw!r}; vLLM refuses a config without one)")
            else:
                k = k_raw
            method = config.get("method") if isinstance(config.get("method"), str) else None
            draft = config.get("model") if isinstance(config.get("model"), str) else None
            if method is None and draft is None:
                missing.append("method and model: the speculative config names neither (vLLM needs one of them)")
            if config.get("num_speculative_tokens_per_batch_size") is not None:
                notes.append("the measured deployment already had a num_speculative_tokens_per_batch_size schedule: "
                             "what was measured was not a fixed K (the schedule written replaces it)")
            if config.get("disable_by_batch_size") is not None:
                notes.append("the measured deployment had disable_by_batch_size (vLLM's V0 engine's switch): what "
                             "was measured was not a fixed K; it is dropped from the config written")
                config = {k2: v for k2, v in config.items() if k2 != "disable_by_batch_size"}
        dp = s.last("--data-parallel-size")
        if dp is not None and (int_or_none(dp.value) or 1) > 1:
            blockers.append(Blocker(f"{dp.written} {dp.value}",
                                    "vLLM disables num_speculative_tokens_per_batch_size with data parallelism > 1 "
                                    "(each DP rank would pick its own K) and falls back to the static K with one "
                                    "warning line", SOURCE))
        return SpecCommand(argv, NAME, k, method, draft, None, config, None, tuple(missing), tuple(blockers),
                           tuple(notes), tuple(drop), insert_at, start)

    def version_status(self, version: str | None) -> tuple[VersionStatus, str]:
        need = f"vLLM >= {FIRST_SCHEDULE[0]}.{FIRST_SCHEDULE[1]} (num_speculative_tokens_per_batch_size)"
        v = version_tuple(version)
        if v is None:
            return VersionStatus.UNKNOWN, f"{need}; the running vLLM's version was not reported"
        if v >= FIRST_SCHEDULE:
            return VersionStatus.HAS_KNOB, f"{need}; the running vLLM is {version}"
        if "dev" in (version or "") or "+" in (version or ""):
            return VersionStatus.UNKNOWN, f"{need}; the running vLLM is a development build ({version})"
        return VersionStatus.NO_KNOB, f"{need}; the running vLLM is {version}, which has no such switch"

    def write(self, cmd: SpecCommand, threshold: int, *, top: int, out_dir: str) -> Written:
        assert cmd.k is not None and cmd.config is not None
        sched = schedule(cmd.k, threshold, top)
        config = {**cmd.config, "num_speculative_tokens_per_batch_size": sched}
        what = f"method {cmd.method}" if cmd.method else f"draft model {cmd.draft}"
        return Written(
            {CONFIG_FILE: json.dumps(config, indent=2) + "\n"},
            ("--speculative-config", json.dumps(config, separators=(",", ":"))),
            measured=f"vLLM with a fixed K = {cmd.k} ({what}) against the baseline",
            does=(f"the measured --speculative-config (method, model, K = {cmd.k} and every other key kept) with "
                  f"num_speculative_tokens_per_batch_size {json.dumps(sched, separators=(',', ':'))}: K = {cmd.k} "
                  f"while the batch is at most {threshold}, K = 0 (no speculation) above"),
            unproven=("vLLM counts every request scheduled in a step, prefills included, as the batch size; the "
                      "levels measured are the clients' concurrency",
                      "vLLM documents Dynamic SD as tested with EAGLE, EAGLE-3 and DFlash only",
                      "vLLM issue #49548: with a schedule, a batch moving across the threshold flips K step to step "
                      "(CUDA-graph shapes, KV lookahead kept at the static K); 8-way throughput fell from 232 to "
                      "24-157 tok/s there: the recommendation's own run checks the levels around the switch"))

    def reference(self, k: int, threshold: int | None, top: int) -> tuple[str, Any]:
        if threshold == 0:
            sched = [[1, max(1, top), 0]]
        elif threshold is None:
            sched = [[1, max(1, top), k]]
        else:
            sched = schedule(k, threshold, top)
        return "vllm_speculative_config", {"num_speculative_tokens": k, "num_speculative_tokens_per_batch_size": sched}

    def identify(self, answers: Answers) -> dict[str, Any] | None:
        if answers.owned_by not in (None, self.owned_by):
            return None
        doc = answers.doc("/version")
        if isinstance(doc, dict) and isinstance(doc.get("version"), str) and fact_value(doc["version"]):
            return {"engine": NAME, "version": doc["version"]}
        return None

    def emulate(self, argv: Sequence[str], *, version: str | None, max_batch: int,
                read_file: ReadFile) -> Emulated:
        args = list(argv[1:] if argv[:1] == ["serve"] else argv)
        s = scan(args, 0, OPTIONS)
        if s.ambiguous:
            written, matches = s.ambiguous[0]
            raise ValueError(f"ambiguous option: {written} could match {', '.join(matches)}")
        port = port_arg(s, 8000)
        running = int_arg(s, "--max-num-seqs", None)
        max_batch = running if running is not None else max_batch
        tag = args[0] if args and not args[0].startswith("-") else None
        model = s.value("--served-model-name") or tag or s.value("--model") or "sim-model"
        dp = int_arg(s, "--data-parallel-size", 1) or 1
        plain = Emulated(port, model, s.value("--host"), s.value("--api-key"), running,
                         info={"data_parallel_size": dp,
                               # the park endpoints (simserver/park.py) and CUDA graphs (none when eager)
                               "enable_sleep_mode": s.has("--enable-sleep-mode"),
                               "enforce_eager": s.has("--enforce-eager")},
                         shutdown=shutdown_of(s))
        raw = s.value("--speculative-config")
        if raw is None:
            return plain
        if len(raw.encode()) > MAX_CONFIG_BYTES * 16:
            raise ValueError("--speculative-config is too large")
        try:
            cfg = json.loads(raw)
        except ValueError as exc:
            raise ValueError(f"--speculative-config is not JSON: {exc}") from None
        if not isinstance(cfg, dict):
            raise ValueError("--speculative-config must be a JSON object")
        k = cfg.get("num_speculative_tokens")
        if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
            raise ValueError(f"Expected num_speculative_tokens to be greater than zero ({k})")
        if cfg.get("method") is None and cfg.get("model") is None:
            raise ValueError("num_speculative_tokens was provided but without speculative model")
        spec = replace(plain, speculative=True, info={**plain.info, "speculative_config": cfg})
        sched = cfg.get("num_speculative_tokens_per_batch_size")
        if sched is None:
            return spec
        v = version_tuple(version)
        if v is not None and v < FIRST_SCHEDULE:
            raise ValueError(f"SpeculativeConfig has no field 'num_speculative_tokens_per_batch_size' (vLLM {version})")
        entries = validate_schedule(sched)
        if dp > 1:
            return replace(spec, warnings=(
                "Dynamic speculative decoding is not supported with data parallelism; disabling "
                f"num_speculative_tokens_per_batch_size and using the static num_speculative_tokens={k}",))
        return replace(spec, threshold=threshold_of(lambda b: lookup(entries, b, k), max_batch))

    def not_taken(self, facts: Mapping[str, Any]) -> str | None:
        return None

    def example(self, *, model: str, draft: str, port: int, gpus: int, steps: int, folder: str) -> Example | None:
        base = (model, "--tensor-parallel-size", str(gpus), "--port", str(port))
        config = {"method": "eagle3", "model": draft, "num_speculative_tokens": steps}
        return Example(("vllm", "serve"), base, (*base, "--speculative-config", json.dumps(config)), {},
                       f"{FIRST_SCHEDULE[0]}.{FIRST_SCHEDULE[1]}.0")


def shutdown_of(s: Scan) -> Shutdown | None:
    """What SIGTERM does with these arguments: ``--shutdown-mode drain`` drains, for at most
    ``--shutdown-drain-timeout`` seconds; None: the lifecycle's (immediate)."""
    mode = s.value("--shutdown-mode")
    if mode not in (None, "immediate", DRAIN_MODE[1]):
        raise ValueError(f"argument --shutdown-mode: invalid choice: {mode!r} (choose from 'immediate', 'drain')")
    timeout = int_arg(s, "--shutdown-drain-timeout", None)
    if timeout is not None and timeout < 0:
        raise ValueError(f"argument --shutdown-drain-timeout: must be >= 0, got {timeout}")
    if mode != DRAIN_MODE[1]:
        return None
    return Shutdown(on_term=OnTerm.DRAIN_REFUSING, timeout_s=float(DRAIN_TIMEOUT_S if timeout is None else timeout),
                    refusal="Server is unavailable. Please try again later.")  # serve/middleware.py's


def validate_schedule(schedule: object) -> list[tuple[int, int, int]]:
    """vLLM's ``validate_and_normalize_dynamic_sd_schedule`` for the 3-item form (the 5-item
    context-length form is not modelled by the simulator)."""
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


def lookup(entries: list[tuple[int, int, int]], batch: int, k_max: int) -> int:
    """vLLM's dense lookup: the range holding the batch, else the K of the last range before it."""
    k = entries[0][2]
    for lo, _hi, kk in entries:
        if lo > batch:
            break
        k = kk
    return min(k_max, k)


ENGINE = VLLM()
