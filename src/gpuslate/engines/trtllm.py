"""TensorRT-LLM: ``trtllm-serve MODEL ... --extra_llm_api_options FILE.yaml``, its ``draft_len_schedule``.

``trtllm-serve`` is a click command (tensorrt_llm/commands/serve.py): whole
option names only, with underscores (``--max_batch_size``, ``--tp_size``), and
``--config`` as another name of ``--extra_llm_api_options``. The options file is
YAML, read with ``yaml.safe_load`` and laid over the command's arguments; its
``speculative_config`` (``decoding_type``, ``max_draft_len``,
``speculative_model``) is the speculation that was measured.

Recommendation: the same file with ``speculative_config.draft_len_schedule``
``{1: K, T: K, T+1: 0}`` (K the measured ``max_draft_len``), written next to the
report, and the command with that file in place of the old one. TensorRT-LLM
read the keys two ways: as lower bounds (the largest key not above the batch:
NVIDIA/TensorRT-LLM PR #8194, two-model and NGram drafters) and, since PR
#10860 (the one-model path, 2026), as upper bounds (the first key not below the
batch; above the largest key, no drafting). These three keys mean "K up to T, 0
above" either way, and pass both validators (a key 1; the smallest key's value
is ``max_draft_len``; every value at most it). ``max_concurrency`` (PR #6676)
is the same switch in one number, mutually exclusive with the schedule; a
measured one is dropped from the file written. A TensorRT-LLM whose speculative
config has no ``draft_len_schedule`` refuses the file at startup (its configs
refuse unknown keys). Sources: docs/experiment.md.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from .args import OptionTable, Style, int_arg, port_arg, scan
from .base import (
    Answers,
    Blocker,
    Counters,
    Emulated,
    Example,
    Knob,
    Launch,
    Lifecycle,
    Listening,
    OnTerm,
    ReadFile,
    Readiness,
    Shutdown,
    SpecCommand,
    VersionStatus,
    Written,
    ambiguity_blockers,
    fact_value,
    threshold_of,
)

NAME = "trtllm"
SOURCE = "tensorrt_llm/llmapi/llm_args.py (DecodingBaseConfig: draft_len_schedule, max_concurrency)"
PARSER_SOURCE = "tensorrt_llm/commands/serve.py (click: whole option names only)"
OPTIONS_FILE = "trtllm-extra-llm-api-options.yaml"
MAX_FILE_BYTES = 256 * 1024
#: decoding types whose drafting a batch-size schedule drives on the PyTorch backend (docs/source/features/
#: speculative-decoding.md: the types trtllm-serve takes; PR #12262 extended the schedule to all of them)
SCHEDULED_TYPES = ("EAGLE3", "EAGLE", "MTP", "NGRAM", "DRAFTTARGET", "PARD", "DFLASH", "SA")

#: trtllm-serve's options (serve.py): the ones gpuslate reads and the others, so that an abbreviation
#: of any is found (click refuses it)
OPTIONS = OptionTable(
    Style.EXACT,
    valued=(("--extra_llm_api_options", "--config"), ("--host",), ("--port",), ("--backend",),
            ("--max_batch_size",), ("--max_num_tokens",), ("--max_seq_len",), ("--max_beam_width",),
            ("--tokenizer",), ("--custom_tokenizer",), ("--log_level",),
            ("--tensor_parallel_size", "--tp_size"), ("--pipeline_parallel_size", "--pp_size"),
            ("--context_parallel_size", "--cp_size"), ("--moe_expert_parallel_size", "--ep_size"),
            ("--moe_cluster_parallel_size", "--cluster_size"), ("--gpus_per_node",),
            ("--free_gpu_memory_fraction", "--kv_cache_free_gpu_memory_fraction"), ("--num_postprocess_workers",),
            ("--revision",), ("--reasoning_parser",), ("--tool_parser",), ("--metadata_server_config_file",),
            ("--server_role",), ("--otlp_traces_endpoint",), ("--disagg_cluster_uri",), ("--media_io_kwargs",),
            ("--chat_template",), ("--custom_module_dirs",)),
    flags=(("--trust_remote_code",), ("--fail_fast_on_attention_window_too_large",), ("--enable_chunked_prefill",)))


#: its port is bound before the LLM is built (commands/serve.py launch_server: s.bind, then the LLM) and listened on
#: once uvicorn serves (serve/openai_server.py __call__: serve(sockets=[s])): refused until then. SIGTERM is
#: uvicorn's own: it closes its port at once and lets the requests in flight finish (no bound of its own:
#: timeout_graceful_shutdown unset), then the LLM shuts down. What the death of an executor worker does was not read.
LIFECYCLE = Lifecycle(listening=Listening.BOUND_REFUSING, shutdown=Shutdown(on_term=OnTerm.DRAIN_CLOSED),
                      health_paths=("/health",),
                      source="tensorrt_llm/commands/serve.py (launch_server), tensorrt_llm/serve/openai_server.py "
                             "(__call__), uvicorn's Server.shutdown")


def schedule(k: int, threshold: int) -> dict[int, int]:
    """``draft_len_schedule`` for "K while the batch is at most T, 0 above", read the same way by
    both key rules (lower bounds, upper bounds)."""
    if k < 1 or threshold < 1:
        raise ValueError(f"K and threshold must be >= 1, got {k}, {threshold}")
    return {1: k, threshold: k, threshold + 1: 0}


def draft_len(sched: Mapping[int, int], batch: int) -> int:
    """TensorRT-LLM's ``get_draft_len_for_batch_size`` since PR #10860: the first key not below the
    batch; above the largest key, 0."""
    for key in sorted(sched):
        if key >= batch:
            return sched[key]
    return 0


def draft_len_lower_bounds(sched: Mapping[int, int], batch: int) -> int:
    """The drafter's lookup of PR #8194: the value of the largest key not above the batch."""
    keys = [key for key in sorted(sched) if key <= batch]
    return sched[keys[-1]] if keys else 0


def validate_schedule(sched: object, max_draft_len: int | None) -> dict[int, int]:
    """``validate_draft_len_schedule_and_sort``: keys >= 1, values >= 0, the smallest key's value
    ``max_draft_len``, every value at most it; sorted. ValueError as TensorRT-LLM words it."""
    if not isinstance(sched, dict) or not sched:
        raise ValueError("draft_len_schedule must be a non-empty mapping of batch size to draft length")
    out: dict[int, int] = {}
    for key, value in sched.items():
        try:
            b = int(key)
        except (TypeError, ValueError):
            raise ValueError(f"draft_len_schedule: batch size {key!r} is not an integer") from None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"draft_len_schedule: draft length {value!r} is not an integer")
        if b < 1:
            raise ValueError(f"draft_len_schedule: batch size threshold must be >= 1, got {b}")
        if value < 0:
            raise ValueError(f"draft_len_schedule: draft length must be >= 0, got {value}")
        out[b] = value
    smallest = min(out)
    if max_draft_len is not None:
        if out[smallest] != max_draft_len:
            raise ValueError(f"draft_len_schedule[{smallest}] must equal max_draft_len because it is the smallest "
                             f"batch-size key. Got schedule[{smallest}]={out[smallest]}, but "
                             f"max_draft_len={max_draft_len}.")
        for b, value in out.items():
            if value > max_draft_len:
                raise ValueError(f"draft_len_schedule: all draft lengths must be <= max_draft_len. Got "
                                 f"draft_len={value} for batch_size={b}, but max_draft_len={max_draft_len}.")
    return dict(sorted(out.items()))


def load_yaml(text: str) -> Any:
    """The options file as ``yaml.safe_load`` reads it (the parser trtllm-serve uses), bounded: at
    most :data:`MAX_FILE_BYTES`, no anchors or aliases (a few lines of them expand to gigabytes once
    walked), no nesting deep enough to exhaust the stack. ValueError: not read."""
    try:
        import yaml  # type: ignore[import-untyped,unused-ignore]  # lazy: optional (the bench extra: YAML files)
    except ImportError:
        raise ValueError("reading a YAML options file needs PyYAML (the bench extra)") from None
    if len(text.encode()) > MAX_FILE_BYTES:
        raise ValueError(f"the options file is over {MAX_FILE_BYTES} bytes")
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                raise ValueError("the options file uses YAML anchors or aliases, which gpuslate does not read")
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"the options file is not YAML: {str(exc).splitlines()[0]}") from None
    except RecursionError:
        raise ValueError("the options file nests too deep") from None


def dump_yaml(doc: Any, indent: int = 0) -> str:
    """Block-style YAML of a JSON-like document that ``yaml.safe_load`` reads back as the same value
    (strings double-quoted, integer keys bare)."""
    pad = " " * indent
    if isinstance(doc, dict):
        if not doc:
            return pad + "{}\n"
        out = []
        for key, value in doc.items():
            head = f"{pad}{_scalar(key)}:"
            if isinstance(value, (dict, list)) and value:
                out.append(head + "\n" + dump_yaml(value, indent + 2))
            else:
                out.append(f"{head} {_flow(value)}\n")
        return "".join(out)
    if isinstance(doc, list):
        if not doc:
            return pad + "[]\n"
        out = []
        for item in doc:
            if isinstance(item, (dict, list)) and item:
                body = dump_yaml(item, indent + 2)
                out.append(f"{pad}- " + body[indent + 2:])
            else:
                out.append(f"{pad}- {_flow(item)}\n")
        return "".join(out)
    return pad + _flow(doc) + "\n"


def _flow(v: Any) -> str:
    if isinstance(v, dict):
        return "{}" if not v else "{" + ", ".join(f"{_scalar(k)}: {_flow(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(_flow(x) for x in v) + "]"
    return _scalar(v)


def _scalar(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"no YAML for {v!r} in a gpuslate file")
        return repr(v)
    text = str(v)
    if _PLAIN.fullmatch(text) and text.lower() not in _YAML_WORDS:
        return text
    return json.dumps(text, ensure_ascii=False)


#: strings written without quotes: nothing YAML 1.1 would read as another type or as syntax
_PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_./-]*")
_YAML_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null"}


class TensorRTLLM:
    name = NAME
    title = "TensorRT-LLM"
    owned_by = "tensorrt_llm"
    launch = Launch(programs=(("trtllm-serve", ("serve",)), ("trtllm-serve", ())),
                    modules=(("tensorrt_llm.commands.serve", ("serve",)), ("tensorrt_llm.commands.serve", ())),
                    other_commands=("grpc", "disaggregated", "disaggregated_mpi_worker", "mm_embedding_serve"))
    options = OPTIONS
    # the socket is bound before the model loads, but uvicorn listens only once it has: /health then /v1/models
    readiness = Readiness(("/health", "/v1/models"), "GET /health, then GET /v1/models, answer 200")
    lifecycle = LIFECYCLE
    knobs = (Knob("speculative_config.max_concurrency", "NVIDIA/TensorRT-LLM PR #6676 (2025-08)", None, SOURCE),
             Knob("speculative_config.draft_len_schedule",
                  "NVIDIA/TensorRT-LLM PR #8194 (2025-10, two-model and NGram drafters); PR #10860 (2026-03, the "
                  "one-model path, keys as upper bounds)", None, SOURCE))
    # recent trtllm-serve has RL-only /release_memory and /resume_memory routes; what they need (and free)
    # was not read: no parking is offered for it
    park = None
    counters = Counters()
    continuous_usage = True  # its StreamOptions has continuous_usage_stats (openai_protocol.py)
    probes = ("/version",)
    plays_others = False
    reported = NAME
    facts = ()
    files = (OPTIONS_FILE,)

    def delegate(self, argv: tuple[str, ...], start: int) -> tuple[str, int] | None:
        return None

    def read(self, argv: tuple[str, ...], start: int, facts: Mapping[str, Any],
             read_file: ReadFile | None) -> SpecCommand:
        s = scan(argv, start, OPTIONS)
        missing: list[str] = []
        notes: list[str] = []
        blockers = list(ambiguity_blockers(s, self.title, PARSER_SOURCE))
        backend = s.value("--backend")
        if backend in ("tensorrt", "trt", "_autodeploy"):
            blockers.append(Blocker(f"--backend {backend}", "draft_len_schedule and max_concurrency are read by the "
                                    "PyTorch backend only (llm_args.py: 'PyTorch backend only')", SOURCE))
        opt = s.last("--extra_llm_api_options")
        base = SpecCommand(argv, NAME, start=start, blockers=tuple(blockers))
        if opt is None or opt.value is None:
            return replace(base, missing=("--extra_llm_api_options: the command names no options file, so it runs "
                                          "no speculative decoding",))
        if read_file is None:
            return replace(base, missing=(f"{opt.value}: the options file was not read",))
        try:
            doc = load_yaml(read_file(opt.value))
        except (OSError, ValueError) as exc:
            return replace(base, missing=(f"{opt.value}: {exc}",))
        spec = doc.get("speculative_config") if isinstance(doc, dict) else None
        if not isinstance(doc, dict) or not isinstance(spec, dict):
            return replace(base, missing=(f"{opt.value}: no speculative_config mapping: the deployment runs no "
                                          "speculative decoding",))
        decoding = spec.get("decoding_type")
        k = spec.get("max_draft_len")
        draft = spec.get("speculative_model", spec.get("speculative_model_dir"))
        if not isinstance(decoding, str):
            missing.append("speculative_config.decoding_type: not given (TensorRT-LLM needs it to choose the config)")
        elif decoding.upper() not in SCHEDULED_TYPES:
            blockers.append(Blocker(f"decoding_type: {decoding}", "not a decoding type whose drafting a batch-size "
                                    "schedule drives on the PyTorch backend (" + ", ".join(SCHEDULED_TYPES) + ")",
                                    "docs/source/features/speculative-decoding.md"))
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            missing.append(f"speculative_config.max_draft_len: no draft length >= 1 ({k!r}): the schedule's 'on' "
                           "side must be the length that was measured")
            k = None
        if spec.get("draft_len_schedule") is not None:
            notes.append("the measured deployment already had a draft_len_schedule: what was measured was not a fixed "
                         "draft length (the schedule written replaces it)")
        if spec.get("max_concurrency") is not None:
            notes.append("the measured deployment had speculative_config.max_concurrency: what was measured was not "
                         "speculation at every batch size; it is dropped from the file written (it and "
                         "draft_len_schedule are mutually exclusive)")
        if doc.get("enable_attention_dp"):
            notes.append("enable_attention_dp: which batch size (a rank's or the whole one's) the schedule is looked "
                         "up by was not read in TensorRT-LLM's sources")
        return SpecCommand(argv, NAME, k, decoding if isinstance(decoding, str) else None,
                           draft if isinstance(draft, str) else None, None, spec, doc, tuple(missing),
                           tuple(blockers), tuple(notes), tuple(s.spans("--extra_llm_api_options")), opt.span[0],
                           start, extras=(("options_flag", opt.written),))

    def version_status(self, version: str | None) -> tuple[VersionStatus, str]:
        shown = f"the running TensorRT-LLM is {version}" if version else \
            "the running TensorRT-LLM's version was not reported"
        return VersionStatus.UNKNOWN, (
            "TensorRT-LLM with speculative_config.draft_len_schedule on the PyTorch backend (NVIDIA/TensorRT-LLM "
            "PR #8194, 2025, for the two-model and NGram drafters; the EAGLE-3 one-model path, its default, reads "
            "it since PR #10860, 2026; the first releases that have them are not in the sources gpuslate was built "
            f"from); {shown}. A TensorRT-LLM without the key refuses this file at startup; for one that has "
            "max_concurrency (PR #6676) but no schedule, speculative_config.max_concurrency: T is the same switch")

    def write(self, cmd: SpecCommand, threshold: int, *, top: int, out_dir: str) -> Written:
        assert cmd.k is not None and cmd.document is not None
        doc = copy.deepcopy(cmd.document)
        spec = {k: v for k, v in doc["speculative_config"].items() if k != "max_concurrency"}
        spec["draft_len_schedule"] = schedule(cmd.k, threshold)
        doc["speculative_config"] = spec
        path = str(Path(out_dir).absolute() / OPTIONS_FILE)
        flag = dict(cmd.extras).get("options_flag", "--extra_llm_api_options")
        head = (f"# written by gpuslate: the measured options with speculative_config.draft_len_schedule: draft "
                f"length {cmd.k} while the batch is at most {threshold}, 0 above\n")
        one_model = cmd.config is not None and cmd.config.get("eagle3_one_model", True) is not False
        unproven = ["which requests TensorRT-LLM counts as the batch size it looks the schedule up by was not read "
                    "in its sources; the levels measured are the clients' concurrency",
                    "above its largest key a one-model drafter skips drafting and, until NVIDIA/TensorRT-LLM PR "
                    "#16888 (open), leaves its draft state stale: once the batch shrinks and speculation resumes, "
                    "acceptance can collapse for the rest of those requests (the recommendation's own run measures "
                    "the levels around the switch)"]
        if one_model and (cmd.method or "").upper() in ("EAGLE3", "EAGLE"):
            unproven.insert(0, "EAGLE-3 one-model (eagle3_one_model, the default) reads the schedule only since "
                            "NVIDIA/TensorRT-LLM PR #10860 (2026); an earlier release accepts the file and ignores "
                            "the schedule (the recommendation's own run shows it: speculation above the threshold)")
        return Written(
            {OPTIONS_FILE: head + dump_yaml(doc)}, (flag, path),
            measured=f"TensorRT-LLM {cmd.method} with a fixed max_draft_len {cmd.k} against the baseline",
            does=(f"the measured options file (every key kept, max_concurrency dropped) with "
                  f"speculative_config.draft_len_schedule {_flow(spec['draft_len_schedule'])}: draft length "
                  f"{cmd.k} while the batch is at most {threshold}, 0 (no drafting) above"),
            unproven=tuple(unproven))

    def reference(self, k: int, threshold: int | None, top: int) -> tuple[str, Any]:
        if threshold == 0:  # no schedule switches speculation off everywhere (its smallest key keeps K)
            return "trtllm_speculative_config", None
        if threshold is None:
            return "trtllm_speculative_config", {"max_draft_len": k}
        return "trtllm_speculative_config", {"max_draft_len": k, "draft_len_schedule": {
            str(b): v for b, v in schedule(k, threshold).items()}}

    def identify(self, answers: Answers) -> dict[str, Any] | None:
        if answers.owned_by != self.owned_by:
            return None
        doc = answers.doc("/version")
        version = doc.get("version") if isinstance(doc, dict) else None
        return {"engine": NAME, "version": version if isinstance(version, str) and fact_value(version) else None}

    def emulate(self, argv: Sequence[str], *, version: str | None, max_batch: int,
                read_file: ReadFile) -> Emulated:
        args = list(argv)
        if args[:1] == ["serve"]:
            args = args[1:]
        elif args[:1] and args[0] in self.launch.other_commands:
            raise ValueError(f"trtllm-serve {args[0]} is not emulated (only serve)")
        s = scan(args, 0, OPTIONS)
        if s.refused:
            written, matches = s.refused[0]
            raise ValueError(f"No such option: {written} Did you mean {', '.join(matches)}?")
        model = args[0] if args and not args[0].startswith("-") else None
        if model is None:
            raise ValueError("Missing argument 'MODEL'.")
        port = port_arg(s, 8000)
        running = int_arg(s, "--max_batch_size", None)
        max_batch = running if running is not None else max_batch
        backend = s.value("--backend") or "pytorch"
        plain = Emulated(port, Path(model).name if Path(model).is_dir() else model, s.value("--host") or "localhost",
                         None, running, info={"backend": backend})
        path = s.value("--extra_llm_api_options")
        if path is None:
            return plain
        doc = load_yaml(read_file(path))
        if doc is None:
            return plain
        if not isinstance(doc, dict):
            raise ValueError("the options file must be a YAML mapping")
        spec = doc.get("speculative_config")
        if spec is None:
            return plain
        if not isinstance(spec, dict) or not isinstance(spec.get("decoding_type"), str):
            raise ValueError("speculative_config: decoding_type is required")
        k = spec.get("max_draft_len")
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
            raise ValueError(f"speculative_config.max_draft_len: {k!r} is not a non-negative integer")
        sched_raw, concurrency = spec.get("draft_len_schedule"), spec.get("max_concurrency")
        if sched_raw is not None and concurrency is not None:
            raise ValueError("max_concurrency and draft_len_schedule are mutually exclusive. Use max_concurrency for a "
                             "simple speculation cutoff, or draft_len_schedule for dynamic draft-length control.")
        if concurrency is not None and (isinstance(concurrency, bool) or not isinstance(concurrency, int)
                                        or concurrency < 1):
            raise ValueError(f"speculative_config.max_concurrency: {concurrency!r} is not a positive integer")
        spec_info = {"decoding_type": spec["decoding_type"], "max_draft_len": k,
                     "draft_len_schedule": sched_raw, "max_concurrency": concurrency}
        speculative = replace(plain, speculative=True, info={**plain.info, "speculative_config": spec_info})
        if sched_raw is None and concurrency is None:
            return speculative
        sched = validate_schedule(sched_raw, k) if sched_raw is not None else {int(concurrency or 1): k or 1}
        if backend != "pytorch":
            return replace(speculative, warnings=(
                f"draft_len_schedule and max_concurrency are read by the PyTorch backend only; --backend {backend} "
                "speculates at every batch size",))
        return replace(speculative, threshold=threshold_of(lambda b: draft_len(sched, b), max_batch))

    def not_taken(self, facts: Mapping[str, Any]) -> str | None:
        return None

    def example(self, *, model: str, draft: str, port: int, gpus: int, steps: int, folder: str) -> Example | None:
        base = (model, "--tp_size", str(gpus), "--port", str(port))
        options = {"speculative_config": {"decoding_type": "Eagle3", "max_draft_len": steps,
                                          "speculative_model": draft}}
        name = "eagle3-options.yaml"
        return Example(("trtllm-serve",), base, (*base, "--extra_llm_api_options", str(Path(folder) / name)),
                       {name: dump_yaml(options)}, "1.3.0")


ENGINE = TensorRTLLM()
