"""The recommendation in the speculative deployment's own terms: read its command, write what its engine needs.

A threshold ``T`` ("speculate while the running batch is at most T") means
nothing to an engine until it is written in that engine's own form, with the
speculative settings that were measured kept as they were. This module reads
the speculative deployment's command line (pure: no process, no file) and
turns a threshold into the files and the whole command line that run it:

* **vLLM** (``vllm serve MODEL ...``, ``python -m vllm.entrypoints.openai.api_server``):
  the command's ``--speculative-config`` JSON (or the older ``--speculative-model``
  / ``--num-speculative-tokens`` flags, turned into that JSON), its method,
  model, K and every other key kept, with ``num_speculative_tokens_per_batch_size``
  ``[[1, T, K], [T + 1, ..., 0]]`` added: ``vllm-speculative-config.json`` and
  the command line with it.
* **SGLang** (``python -m sglang.launch_server ...``): ``--speculative-adaptive
  --speculative-adaptive-config FILE`` added, FILE keyed by batch-size lower
  bounds: ``{"1": {"candidate_steps": [S]}, "T+1": {"candidate_steps": [0]}}``
  with ``S`` the measured ``--speculative-num-steps`` (one candidate: the step
  count that was measured, never one SGLang picks by itself), plus a top-level
  ``candidate_steps`` ``[S]`` that the keyed loader ignores and the flat loader
  of earlier SGLang refuses at startup (it needs two values), so an engine that
  cannot read the keys fails loudly instead of never switching speculation off.
* **gpuslate's simulator** (``gpuslate sim serve --mode speculative``): its own
  ``--spec-disable-threshold T``, a flag of the simulator only.

Settings under which the engine ignores or disables the knob are *blockers*
(vLLM: ``--data-parallel-size`` > 1; SGLang: the set-ups its adaptive mode
refuses, falling back to static settings with one log line); with a blocker,
or an engine version known to lack the knob, or a command that cannot be read
(the arguments missing are named), nothing is written: a file that silently
does nothing is worse than none. The upstream sources these rules come from
are cited in docs/experiment.md.
"""

from __future__ import annotations

import enum
import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

Engine = Literal["vllm", "sglang", "sim"]

#: the first vLLM release whose documentation has Dynamic SD (num_speculative_tokens_per_batch_size)
VLLM_FIRST_SCHEDULE = (0, 25)
VLLM_SOURCE = "vllm/v1/spec_decode/dynamic/utils.py, docs/features/speculative_decoding/dynamic_speculative_decoding.md"
SGLANG_SOURCE = "python/sglang/srt/speculative/adaptive_spec_params.py (adaptive_unsupported_reason)"
SGLANG_ADAPTIVE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN")  # NEXTN: SGLang's server args turn it into EAGLE
VLLM_CONFIG_FILE = "vllm-speculative-config.json"
SGLANG_CONFIG_FILE = "sglang-adaptive-config.json"
SGLANG_ARGS_FILE = "sglang-args.txt"
COMMAND_FILE = "recommended-command.txt"
MAX_CONFIG_BYTES = 64 * 1024  # a --speculative-config larger than this is not read

# older vLLM flags (before --speculative-config) -> the key they became
_VLLM_OLD_FLAGS = {
    "--speculative-model": "model", "--num-speculative-tokens": "num_speculative_tokens",
    "--speculative-draft-tensor-parallel-size": "draft_tensor_parallel_size",
    "--speculative-max-model-len": "max_model_len", "--ngram-prompt-lookup-max": "prompt_lookup_max",
    "--ngram-prompt-lookup-min": "prompt_lookup_min", "--speculative-disable-by-batch-size": "disable_by_batch_size",
}
_VLLM_INT_KEYS = {"num_speculative_tokens", "draft_tensor_parallel_size", "max_model_len", "prompt_lookup_max",
                  "prompt_lookup_min", "disable_by_batch_size"}
_SGLANG_VALUED = ("--speculative-algorithm", "--speculative-draft-model-path", "--speculative-draft-model",
                  "--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens",
                  "--speculative-adaptive-config", "--dp-size", "--data-parallel-size")
_SGLANG_FLAGS = ("--speculative-adaptive", "--enable-dp-attention", "--enable-multi-layer-eagle",
                 "--enable-two-batch-overlap", "--enable-pdmux")
# SGLang's adaptive mode falls back to static settings under these (adaptive_unsupported_reason)
_SGLANG_BLOCKING_FLAGS = {
    "--enable-dp-attention": "attention DP: SGLang's adaptive mode does not support it (its per-batch decisions "
                             "are not synchronized across DP ranks) and falls back to static settings",
    "--enable-multi-layer-eagle": "multi-layer EAGLE does not implement the adaptive mode; SGLang falls back to "
                                  "static settings",
    "--enable-two-batch-overlap": "two-batch overlap is not supported by the adaptive mode; SGLang falls back to "
                                  "static settings",
    "--enable-pdmux": "PD multiplexing is not supported by the adaptive mode; SGLang falls back to static settings",
}


class ApplyStatus(str, enum.Enum):
    """What ``apply`` could do with a recommendation."""

    READY = "ready"  # the files and the command line are written
    AS_MEASURED = "as_measured"  # always off / never disable: a measured deployment's command, unchanged
    BLOCKED = "blocked"  # a setting, or the engine's version, keeps the engine from applying it: nothing written
    UNREADABLE = "unreadable"  # the command cannot be read (what is missing is named): nothing written
    NOT_RECOMMENDED = "not_recommended"  # no threshold recommended: nothing written


class VersionStatus(str, enum.Enum):
    HAS_KNOB = "has_knob"
    NO_KNOB = "no_knob"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Blocker:
    """A setting of the command under which the engine ignores or disables the knob."""

    setting: str
    why: str
    source: str

    def to_json(self) -> dict[str, str]:
        return {"setting": self.setting, "why": self.why, "source": self.source}


@dataclass(frozen=True)
class SpecCommand:
    """The speculative settings read from a deployment's command (see :func:`read_command`)."""

    argv: tuple[str, ...]
    engine: Engine | None
    k: int | None = None  # vLLM num_speculative_tokens; SGLang speculative_num_steps
    method: str | None = None  # vLLM method; SGLang speculative_algorithm
    draft: str | None = None
    topk: int | None = None
    config: dict[str, Any] | None = None  # vLLM: the --speculative-config (or what the older flags say)
    missing: tuple[str, ...] = ()  # why nothing can be written from it
    blockers: tuple[Blocker, ...] = ()
    notes: tuple[str, ...] = ()
    drop: tuple[tuple[int, int], ...] = ()  # argv spans replaced when the recommendation is written
    insert_at: int | None = None  # where the new arguments go (None: at the end)

    @property
    def readable(self) -> bool:
        return self.engine is not None and not self.missing

    def to_json(self) -> dict[str, Any]:
        return {"engine": self.engine, "k": self.k, "method": self.method, "draft": self.draft, "topk": self.topk,
                "speculative_config": self.config, "missing": list(self.missing),
                "blockers": [b.to_json() for b in self.blockers], "notes": list(self.notes)}


@dataclass(frozen=True)
class ApplyPlan:
    """The recommendation as its engine takes it, and what the report says about it."""

    status: ApplyStatus
    engine: Engine | None
    command: tuple[str, ...] = ()  # the whole command line that runs the recommendation
    files: dict[str, str] = field(default_factory=dict)  # name -> text, written next to report.md
    measured: str = ""  # what was measured
    does: str = ""  # what the files do
    versions: str = ""  # on which engine versions
    unproven: tuple[str, ...] = ()
    blockers: tuple[Blocker, ...] = ()
    missing: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    version: str | None = None
    version_status: VersionStatus = VersionStatus.UNKNOWN

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status.value, "engine": self.engine, "version": self.version,
                "version_status": self.version_status.value, "command": list(self.command),
                "command_line": shlex.join(self.command) if self.command else None,
                "files": dict(self.files), "measured": self.measured, "does": self.does,
                "versions": self.versions, "unproven": list(self.unproven),
                "blockers": [b.to_json() for b in self.blockers], "missing": list(self.missing),
                "notes": list(self.notes)}


# -- reading a command ---------------------------------------------------------------


@dataclass(frozen=True)
class _Opt:
    value: str | None
    span: tuple[int, int]


def _find(argv: Sequence[str], names: Sequence[str], start: int, *, valued: bool,
          known: Sequence[str] = ()) -> _Opt | None:
    """The last occurrence of one of ``names`` after ``start`` (argparse: the last one wins), up to
    a ``--``: ``--name VALUE`` or ``--name=VALUE`` (valued), ``--name`` (a flag). With ``known``
    (every flag of the engine gpuslate reads), an unambiguous abbreviation of a ``--speculative-``
    name counts too, as argparse takes it (SGLang's ``--speculative-algo``)."""

    def matches(name: str) -> bool:
        if name in names:
            return True
        if not known or not name.startswith("--speculative-") or name in known:
            return False
        full = [n for n in known if n.startswith(name)]
        return len(full) == 1 and full[0] in names

    found = None
    i = start
    while i < len(argv) and argv[i] != "--":
        name, eq, val = argv[i].partition("=")
        if matches(name):
            if not valued:
                found = _Opt(None, (i, i + 1))
            elif eq:
                found = _Opt(val, (i, i + 1))
            elif i + 1 < len(argv):
                found = _Opt(argv[i + 1], (i, i + 2))
                i += 1
            else:
                found = _Opt(None, (i, i + 1))
        i += 1
    return found


def _vllm_names(flag: str) -> tuple[str, str]:
    """vLLM takes ``--foo_bar`` for ``--foo-bar``."""
    return flag, "--" + flag[2:].replace("-", "_")


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _program_start(argv: Sequence[str]) -> int:
    """Skip an ``env [-i] [NAME=VALUE ...]`` prefix: the index of the program itself."""
    i = 0
    if argv and Path(argv[0]).name == "env":
        i = 1
        while i < len(argv) and (argv[i] in ("-i", "--ignore-environment") or
                                 (re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", argv[i]) is not None)):
            i += 1
    return i


def detect_engine(argv: Sequence[str]) -> tuple[Engine | None, int]:
    """The engine a command runs and the index where its own arguments start."""
    i = _program_start(argv)
    if i >= len(argv):
        return None, len(argv)
    prog = Path(argv[i]).name
    rest = list(argv[i + 1:])
    if prog == "vllm" and rest[:1] == ["serve"]:
        return "vllm", i + 2
    if prog == "gpuslate" and rest[:2] == ["sim", "serve"]:
        return "sim", i + 3
    if re.fullmatch(r"python[0-9.]*", prog):
        j = i + 1
        while j < len(argv) and argv[j].startswith("-") and argv[j] != "-m":
            j += 1  # interpreter options (-u, -X ...) before -m
        if j + 1 < len(argv) and argv[j] == "-m":
            module, after = argv[j + 1], list(argv[j + 2:])
            if module in ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server"):
                return "vllm", j + 2
            if module == "vllm.entrypoints.cli.main" and after[:1] == ["serve"]:
                return "vllm", j + 3
            if module == "sglang.launch_server":
                return "sglang", j + 2
            if module == "gpuslate" and after[:2] == ["sim", "serve"]:
                return "sim", j + 4
    return None, i + 1


def read_command(argv: Sequence[str], facts: Mapping[str, Any] | None = None) -> SpecCommand:
    """The speculative settings of a deployment's command. ``facts``: what the running server
    reported (SGLang's ``/server_info`` server args), used where the command names nothing
    (a step count SGLang chose itself) and to find blockers set by other means (a config file)."""
    argv = tuple(argv)
    engine, start = detect_engine(argv)
    if engine == "vllm":
        return _read_vllm(argv, start)
    if engine == "sglang":
        return _read_sglang(argv, start, dict(facts or {}))
    if engine == "sim":
        return _read_sim(argv, start, dict(facts or {}))
    return SpecCommand(argv, None, missing=(
        "the command is none gpuslate reads (vllm serve ..., python -m vllm.entrypoints.openai.api_server ..., "
        "python -m sglang.launch_server ..., gpuslate sim serve ...): write the configuration by hand",))


def _read_vllm(argv: tuple[str, ...], start: int) -> SpecCommand:
    missing: list[str] = []
    notes: list[str] = []
    blockers: list[Blocker] = []
    drop: list[tuple[int, int]] = []
    config: dict[str, Any] | None = None
    insert_at = None
    dotted = [a for a in argv[start:] if re.match(r"--speculative[-_]config\.", a)]
    opt = _find(argv, _vllm_names("--speculative-config"), start, valued=True)
    old = {flag: o for flag in _VLLM_OLD_FLAGS if (o := _find(argv, _vllm_names(flag), start, valued=True))}
    if dotted:
        missing.append(f"{dotted[0].partition('=')[0]}: vLLM's dotted --speculative-config.KEY arguments are "
                       "not read by gpuslate; give the whole --speculative-config JSON")
    if opt is not None:
        drop.append(opt.span)
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
            missing.append(f"both --speculative-config and the older {', '.join(old)}: vLLM takes one or the other")
    elif old:
        config = {}
        for flag, o in old.items():
            drop.append(o.span)
            key = _VLLM_OLD_FLAGS[flag]
            value = _int(o.value) if key in _VLLM_INT_KEYS else o.value
            if value is None:
                missing.append(f"{flag} has no usable value ({o.value!r})")
            else:
                config[key] = value
        insert_at = min(o.span[0] for o in old.values())
        notes.append(f"the older flags {', '.join(old)} are written as one --speculative-config (the form vLLM took "
                     "them in before it dropped them; the per-batch-size schedule needs a vLLM that has it)")
    else:
        if _find(argv, ("--config",), start, valued=True):
            missing.append("--speculative-config: not in the command (a --config FILE may hold it; gpuslate does "
                           "not read that file)")
        else:
            missing.append("--speculative-config: the command runs no speculative decoding")
    k = method = draft = None
    if config is not None:
        k_raw = config.get("num_speculative_tokens")
        if isinstance(k_raw, bool) or not isinstance(k_raw, int) or k_raw < 1:
            missing.append("num_speculative_tokens (K): "
                           + ("not in the speculative config (vLLM then takes it from the draft model's config, "
                              "which gpuslate does not read)" if k_raw is None else f"not an integer >= 1 ({k_raw!r})"))
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
            notes.append("the measured deployment had disable_by_batch_size (vLLM's V0 engine's switch): what was "
                         "measured was not a fixed K; it is dropped from the config written")
            config = {k2: v for k2, v in config.items() if k2 != "disable_by_batch_size"}
    dp = _find(argv, (*_vllm_names("--data-parallel-size"), "-dp"), start, valued=True)
    if dp is not None and (_int(dp.value) or 1) > 1:
        blockers.append(Blocker(f"--data-parallel-size {dp.value}",
                                "vLLM disables num_speculative_tokens_per_batch_size with data parallelism > 1 "
                                "(each DP rank would pick its own K) and falls back to the static K with one "
                                "warning line", VLLM_SOURCE))
    return SpecCommand(argv, "vllm", k, method, draft, None, config, tuple(missing), tuple(blockers), tuple(notes),
                       tuple(drop), insert_at)


def _read_sglang(argv: tuple[str, ...], start: int, facts: dict[str, Any]) -> SpecCommand:
    known = _SGLANG_VALUED + _SGLANG_FLAGS

    def val(*names: str) -> _Opt | None:
        return _find(argv, names, start, valued=True, known=known)

    def flag(name: str) -> _Opt | None:
        return _find(argv, (name,), start, valued=False, known=known)

    missing: list[str] = []
    notes: list[str] = []
    blockers: list[Blocker] = []
    algo_o = val("--speculative-algorithm")
    algorithm = algo_o.value if algo_o else facts.get("speculative_algorithm")
    steps_o = val("--speculative-num-steps")
    steps = _int(steps_o.value) if steps_o else None
    if steps is None and isinstance(facts.get("speculative_num_steps"), int) and not flag("--speculative-adaptive"):
        steps = facts["speculative_num_steps"]
        notes.append(f"--speculative-num-steps: not in the command; the running server reported {steps} "
                     "(the count SGLang chose), which is what was measured")
    topk_o = val("--speculative-eagle-topk")
    topk = _int(topk_o.value) if topk_o else (facts.get("speculative_eagle_topk")
                                              if isinstance(facts.get("speculative_eagle_topk"), int) else None)
    draft_o = val("--speculative-draft-model-path", "--speculative-draft-model")
    if not algorithm:
        missing.append("--speculative-algorithm: the command runs no speculative decoding")
    if steps is None or steps < 1:
        missing.append("--speculative-num-steps: " + ("not in the command, and the server reported none"
                                                      if steps is None else f"not >= 1 ({steps})")
                       + " (the adaptive config's 'on' side must be the step count that was measured)")
    if algorithm and algorithm.upper() not in SGLANG_ADAPTIVE_ALGORITHMS:
        blockers.append(Blocker(f"--speculative-algorithm {algorithm}",
                                "SGLang's adaptive mode supports only EAGLE and EAGLE3; with any other algorithm "
                                "it falls back to static settings with one log line", SGLANG_SOURCE))
    if topk is not None and topk != 1:
        blockers.append(Blocker(f"--speculative-eagle-topk {topk}",
                                "SGLang's adaptive mode supports only topk 1; with another it falls back to "
                                "static settings with one log line", SGLANG_SOURCE))
    elif topk is None:
        notes.append("--speculative-eagle-topk: not in the command; the adaptive mode runs topk 1, which may not be "
                     "what SGLang chose for the measured deployment")
    for name, why in _SGLANG_BLOCKING_FLAGS.items():
        key = name[2:].replace("-", "_")
        if flag(name) or facts.get(key) is True:
            blockers.append(Blocker(name, why, SGLANG_SOURCE))
    drop = [o.span for o in (flag("--speculative-adaptive"), val("--speculative-adaptive-config")) if o]
    if flag("--speculative-adaptive"):
        notes.append("the measured deployment already ran --speculative-adaptive: what was measured was not a fixed "
                     "step count (its adaptive config is replaced)")
    if _find(argv, ("--config",), start, valued=True):
        notes.append("a --config FILE may set more of SGLang's arguments; gpuslate reads only the command line "
                     "(and what the running server reported)")
    return SpecCommand(argv, "sglang", steps, algorithm, draft_o.value if draft_o else None, topk, None,
                       tuple(missing), tuple(blockers), tuple(notes), tuple(drop), None)


def _read_sim(argv: tuple[str, ...], start: int, facts: dict[str, Any]) -> SpecCommand:
    mode = _find(argv, ("--mode",), start, valued=True)
    emulate = _find(argv, ("--emulate",), start, valued=True)
    if emulate is not None and emulate.value in ("vllm", "sglang"):
        # the simulator playing an engine: its own arguments follow '--'
        sep = argv.index("--", start) if "--" in argv[start:] else None
        if sep is not None:
            inner = _read_vllm(argv, sep + 1) if emulate.value == "vllm" else _read_sglang(argv, sep + 1, facts)
            return inner
        return SpecCommand(argv, "sim", missing=("--emulate without the engine's arguments after '--'",))
    if mode is None or mode.value != "speculative":
        return SpecCommand(argv, "sim", missing=("--mode speculative: the simulated server does not speculate",))
    drop = [o.span for o in (_find(argv, ("--spec-disable-threshold",), start, valued=True),) if o]
    return SpecCommand(argv, "sim", drop=tuple(drop))


# -- versions ------------------------------------------------------------------------


def version_status(engine: Engine | None, version: str | None) -> tuple[VersionStatus, str]:
    """Whether the engine's version has the knob, and the sentence the report says about it."""
    if engine == "sim":
        return VersionStatus.HAS_KNOB, "any gpuslate simulator (--spec-disable-threshold)"
    if engine == "vllm":
        need = f"vLLM >= {VLLM_FIRST_SCHEDULE[0]}.{VLLM_FIRST_SCHEDULE[1]} (num_speculative_tokens_per_batch_size)"
        m = re.match(r"v?(\d+)\.(\d+)", version or "")
        if m is None:
            return VersionStatus.UNKNOWN, f"{need}; the running vLLM's version was not reported"
        if (int(m.group(1)), int(m.group(2))) >= VLLM_FIRST_SCHEDULE:
            return VersionStatus.HAS_KNOB, f"{need}; the running vLLM is {version}"
        if "dev" in (version or "") or "+" in (version or ""):
            return VersionStatus.UNKNOWN, f"{need}; the running vLLM is a development build ({version})"
        return VersionStatus.NO_KNOB, f"{need}; the running vLLM is {version}, which has no such switch"
    if engine == "sglang":
        shown = f"the running SGLang is {version}" if version else "the running SGLang's version was not reported"
        return VersionStatus.UNKNOWN, (
            "SGLang with batch-size keys in --speculative-adaptive-config (they came with sgl-project/sglang PR "
            f"#24055, 2026; the first release that has them is not in the sources gpuslate was built from); {shown}. "
            "An SGLang whose loader reads only a flat candidate_steps refuses this file at startup; one without "
            "--speculative-adaptive refuses the flag")
    return VersionStatus.UNKNOWN, "unknown engine"


def no_switch_sentence(engine: Engine | None, version: str | None) -> str:
    name = {"vllm": "vLLM", "sglang": "SGLang"}.get(engine or "", "this engine")
    return (f"{name} {version or ''}".rstrip() + " has no upstream switch to turn speculation off above a batch "
            "size. The ways left: a patched engine with a flag of the seed's kind "
            "(--speculative-disable-batch-threshold N), or routing: send requests to the speculative deployment "
            "while fewer than T+1 are in flight, to a baseline deployment above")


# -- writing the recommendation ------------------------------------------------------


def sglang_adaptive_config(steps: int, threshold: int) -> dict[str, Any]:
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


def vllm_schedule(k: int, threshold: int, top: int) -> list[list[int]]:
    """``num_speculative_tokens_per_batch_size``: K up to ``threshold``, 0 above (the last range's K
    holds for every larger batch, so its end, the larger of ``top`` and T+1, bounds nothing)."""
    if k < 1 or threshold < 1:
        raise ValueError(f"K and threshold must be >= 1, got {k}, {threshold}")
    return [[1, threshold, k], [threshold + 1, max(threshold + 1, top), 0]]


def _rewritten(cmd: SpecCommand, new: Sequence[str]) -> tuple[str, ...]:
    """``cmd``'s argv with its ``drop`` spans left out and ``new`` put where the first of them was
    (``insert_at``), or at the end."""
    out: list[str] = []
    for i, a in enumerate(cmd.argv):
        if i == cmd.insert_at:
            out += new
        if not any(lo <= i < hi for lo, hi in cmd.drop):
            out.append(a)
    if cmd.insert_at is None or cmd.insert_at >= len(cmd.argv):
        out += new
    return tuple(out)


def plan_apply(cmd: SpecCommand, threshold: int, *, top: int, out_dir: str | Path,
               version: str | None) -> ApplyPlan:
    """The files and the command line that run "speculate while the batch is at most ``threshold``"
    on ``cmd``'s engine (pure: nothing is written here). ``top``: the largest level measured;
    ``version``: the engine's, as the running server reported it."""
    vstat, versions = version_status(cmd.engine, version)
    base = ApplyPlan(ApplyStatus.READY, cmd.engine, versions=versions, blockers=cmd.blockers, missing=cmd.missing,
                     notes=cmd.notes, version=version, version_status=vstat)
    if not cmd.readable:
        return replace(base, status=ApplyStatus.UNREADABLE)
    if vstat is VersionStatus.NO_KNOB:
        return replace(base, status=ApplyStatus.BLOCKED, notes=(*cmd.notes, no_switch_sentence(cmd.engine, version)))
    if cmd.blockers:
        return replace(base, status=ApplyStatus.BLOCKED)
    unproven: list[str] = []
    files: dict[str, str] = {}
    if cmd.engine == "vllm":
        assert cmd.k is not None and cmd.config is not None
        sched = vllm_schedule(cmd.k, threshold, top)
        config = {**cmd.config, "num_speculative_tokens_per_batch_size": sched}
        command = _rewritten(cmd, ["--speculative-config", json.dumps(config, separators=(",", ":"))])
        files[VLLM_CONFIG_FILE] = json.dumps(config, indent=2) + "\n"
        what = f"method {cmd.method}" if cmd.method else f"draft model {cmd.draft}"
        measured = f"vLLM with a fixed K = {cmd.k} ({what}) against the baseline"
        does = (f"the measured --speculative-config (method, model, K = {cmd.k} and every other key kept) with "
                f"num_speculative_tokens_per_batch_size {json.dumps(sched, separators=(',', ':'))}: K = {cmd.k} "
                f"while the batch is at most {threshold}, K = 0 (no speculation) above")
        unproven += ["vLLM counts every request scheduled in a step, prefills included, as the batch size; the "
                     "levels measured are the clients' concurrency",
                     "vLLM documents Dynamic SD as tested with EAGLE, EAGLE-3 and DFlash only"]
    elif cmd.engine == "sglang":
        assert cmd.k is not None
        args = ["--speculative-adaptive", "--speculative-adaptive-config",
                str(Path(out_dir).absolute() / SGLANG_CONFIG_FILE)]
        command = _rewritten(cmd, args)
        files[SGLANG_CONFIG_FILE] = json.dumps(sglang_adaptive_config(cmd.k, threshold), indent=2) + "\n"
        files[SGLANG_ARGS_FILE] = shlex.join(args) + "\n"
        measured = f"SGLang {cmd.method} with a fixed --speculative-num-steps {cmd.k} against the baseline"
        does = (f"--speculative-adaptive with batch-size keys: {cmd.k} steps (one candidate: SGLang does not change "
                f"it) for batches of at most {threshold}, 0 steps from {threshold + 1} on")
        unproven += ["SGLang's 0 steps is not the baseline that was measured: it still runs a 1-token target "
                     "verify and the draft model's extend at every step (eagle_worker_v2.py)",
                     "SGLang routes a batch after padding it up to a captured CUDA-graph batch size: a batch of "
                     f"at most {threshold} padded past it runs 0 steps, so the switch is exactly at {threshold} "
                     f"only if {threshold} is a captured size (adaptive_step_router.py)"]
    else:
        command = _rewritten(cmd, ["--spec-disable-threshold", str(threshold)])
        measured = "the simulated server in speculative mode against its baseline mode"
        does = (f"the simulator's own --spec-disable-threshold {threshold} (a flag of gpuslate's simulator, which "
                f"no engine takes): speculative steps while the batch is at most {threshold}, baseline steps above")
    files[COMMAND_FILE] = shlex.join(command) + "\n"
    return replace(base, command=command, files=files, measured=measured, does=does, unproven=tuple(unproven))


def plan_as_measured(decision: str, argv: Sequence[str], engine: Engine | None, version: str | None) -> ApplyPlan:
    """Always off or never disable: the recommendation is a deployment that was measured, as it is."""
    what = "the baseline deployment" if decision == "always_off" else "the speculative deployment"
    vstat, versions = version_status(engine, version)
    return ApplyPlan(ApplyStatus.AS_MEASURED, engine, tuple(argv), {COMMAND_FILE: shlex.join(argv) + "\n"},
                     measured=f"{what}, as it ran", does=f"nothing to switch: run {what} as it is",
                     versions=versions, version=version, version_status=vstat)
