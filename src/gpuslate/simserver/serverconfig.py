"""Configuration and command-line flags of ``gpuslate sim serve``.

Kept apart from the server so the CLI can build and validate a config
without importing aiohttp.
"""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .._parse import parse_seconds
from ..engines import ParkReading, engine
from ..engines.base import Lifecycle, Shutdown
from ..engines.sim import ENGINE as SIM
from ..errors import UsageError
from .engineargs import EMULATED, settings
from .parkmodel import MISBEHAVIOURS
from .perfmodel import MODES, PerfParams


@dataclass
class ServerConfig:
    """Everything ``sim serve`` needs; see docs/sim-server.md for the meaning of each field."""

    host: str = "127.0.0.1"
    port: int = 30000  # 0 binds a free port (logged)
    model: str = "sim-model"
    mode: str = "baseline"
    spec_disable_threshold: int | None = None
    startup_seconds: float = 5.0
    fail_startup: bool = False
    time_scale: float = 1.0
    max_running_requests: int = 256
    context_length: int = 32768
    eos_after_tokens: int = 256
    stream_usage: bool = True  # False: ignore stream_options.include_usage, as older servers do
    api_key: str | None = None  # /v1 routes then want Authorization: Bearer KEY (vLLM's --api-key)
    # Long-context prompts exceed aiohttp's 1 MiB default body limit.
    max_body_bytes: int = 64 * 1024 * 1024
    perf: PerfParams = field(default_factory=PerfParams)
    # --emulate ENGINE -- ARGS: the engine whose arguments set the above (engineargs.py), its version
    # as the server reports it, the engine's own facts and the warnings it logged about its arguments
    emulate: str | None = None
    engine_version: str | None = None
    patched_flag: str | None = None  # with --emulate: the engine is patched to take this flag (speculate while <= T)
    engine_info: dict[str, Any] = field(default_factory=dict)
    engine_warnings: tuple[str, ...] = ()
    engine_park: ParkReading | None = None  # how the emulated engine parks under its arguments (engines' Park)
    engine_shutdown: Shutdown | None = None  # what SIGTERM does under the engine's arguments (None: its lifecycle's)
    # slow to drain: after SIGTERM it goes no sooner than this (its engine's drain lasts at least this long)
    drain_seconds: float = 0.0
    # parking (--emulate vllm with --enable-sleep-mode, --emulate sglang with --enable-memory-saver; park.py):
    # how long the engine takes to let its memory go, to take it back, to reload its weights (None: the
    # weight-loading share of the startup, half of it), and the misbehaviours switched on
    sleep_seconds: float = 0.5
    wake_seconds: float = 0.5
    reload_seconds: float | None = None
    misbehave: tuple[str, ...] = ()

    @property
    def lifecycle(self) -> Lifecycle:
        """How it starts and stops: its emulated engine's (the registry's), else the simulator's own."""
        played = engine(self.emulate) if self.emulate else None
        return (played or SIM).lifecycle

    @property
    def shutdown(self) -> Shutdown:
        """What SIGTERM does: as its engine's arguments choose, else as its engine does."""
        return self.engine_shutdown or self.lifecycle.shutdown

    def validate(self) -> None:
        """Raise ValueError with a one-line message on the first bad value."""
        if not self.host:
            raise ValueError("host must not be empty")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0..65535, got {self.port}")
        if not self.model:
            raise ValueError("model name must not be empty")
        if self.api_key is not None and (not self.api_key or any(c in self.api_key for c in "\r\n\0")):
            raise ValueError("API key must be one non-empty line")
        if self.emulate is not None and self.emulate not in EMULATED:
            raise ValueError(f"--emulate must be one of {', '.join(EMULATED)}, got {self.emulate!r}")
        if self.patched_flag is not None and (self.emulate is None or not re.fullmatch(
                r"(--)?[A-Za-z0-9][A-Za-z0-9_-]*", self.patched_flag)):
            raise ValueError("--patched-flag needs --emulate and one option name, e.g. "
                             "speculative-disable-batch-threshold")
        if self.engine_version is not None and (not self.engine_version or len(self.engine_version) > 64
                                                or any(not c.isprintable() for c in self.engine_version)):
            raise ValueError("engine version must be 1 to 64 printable characters")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.spec_disable_threshold is not None:
            if self.mode != "speculative":
                raise ValueError("--spec-disable-threshold needs --mode speculative")
            if self.spec_disable_threshold < 0:
                raise ValueError("spec disable threshold must be >= 0, "
                                 f"got {self.spec_disable_threshold}")
        if not math.isfinite(self.startup_seconds) or self.startup_seconds < 0:
            raise ValueError(f"startup seconds must be >= 0, got {self.startup_seconds}")
        if not math.isfinite(self.time_scale) or self.time_scale <= 0:
            raise ValueError(f"time scale must be > 0, got {self.time_scale}")
        for name in ("sleep_seconds", "wake_seconds", "reload_seconds", "drain_seconds"):
            v = getattr(self, name)
            if v is not None and (not math.isfinite(v) or v < 0):
                raise ValueError(f"{name.replace('_', ' ')} must be >= 0, got {v}")
        bad = [m for m in self.misbehave if m not in MISBEHAVIOURS]
        if bad:
            raise ValueError(f"--misbehave must be one of {', '.join(MISBEHAVIOURS)}, got {bad[0]!r}")
        if self.misbehave and self.emulate is None:
            raise ValueError("--misbehave plays an engine's park endpoints: it needs --emulate vllm|sglang")
        for name, minimum in (("max_running_requests", 1), ("context_length", 2),
                              ("eos_after_tokens", 1), ("max_body_bytes", 1024)):
            if getattr(self, name) < minimum:
                raise ValueError(f"{name} must be >= {minimum}, got {getattr(self, name)}")
        self.perf.validate()


# (flag, PerfParams attribute, help); every perf flag is a float and its default
# comes from PerfParams, so the docs, --help and the model cannot disagree.
_PERF_FLAGS: tuple[tuple[str, str, str], ...] = (
    ("--accept-length", "accept_length", "mean accepted tokens per request per speculative step (>= 1)"),
    ("--base-step-ms", "base_step_ms", "fixed cost of a baseline decode step, ms"),
    ("--base-per-request-ms", "base_per_request_ms", "baseline step cost per running request, ms"),
    ("--spec-step-ms", "spec_step_ms", "fixed cost of a speculative (draft + verify) step, ms"),
    ("--spec-per-request-ms", "spec_per_request_ms", "speculative step cost per running request, ms"),
    ("--prefill-ms-per-token", "prefill_ms_per_token",
     "prefill cost per prompt token of newly admitted requests, ms"),
    ("--switch-ms", "switch_ms",
     "cost of a step whose kind differs from the step before it (speculation switched on or off), ms"),
)


def _duration(text: str) -> float:
    """A duration of the simulated engine (seconds, or ``2s``, ``500ms``): the one duration parser."""
    try:
        return parse_seconds(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``sim serve`` flags; values are validated by :func:`config_from_args`."""
    d = ServerConfig()
    # Defaults stay None so config_from_args can tell "not given" from "given".
    parser.add_argument("--host", help=f"address to bind (default: {d.host})")
    parser.add_argument("--port", type=int, help=f"port to bind, 0 for a free one (default: {d.port})")
    parser.add_argument("--model", help=f"served model name (default: {d.model})")
    parser.add_argument("--mode", choices=MODES, help=f"decoding mode (default: {d.mode})")
    parser.add_argument("--spec-disable-threshold", type=int, metavar="T",
                        help="with --mode speculative: speculate only while the running batch is <= T")
    parser.add_argument("--startup-seconds", type=_duration, metavar="DURATION",
                        help=f"simulated model-loading time (default: {d.startup_seconds}s)")
    parser.add_argument("--fail-startup", action="store_true", default=None,
                        help="crash partway through startup and exit 1")
    parser.add_argument("--time-scale", type=float, metavar="FACTOR",
                        help=f"speed-up factor for startup and step times (default: {d.time_scale})")
    parser.add_argument("--max-running-requests", type=int, metavar="N",
                        help=f"largest running batch (default: {d.max_running_requests})")
    parser.add_argument("--context-length", type=int, metavar="TOKENS",
                        help=f"prompt + completion token limit (default: {d.context_length})")
    parser.add_argument("--eos-after-tokens", type=int, metavar="N",
                        help="tokens after which the model stops unless the request sets "
                        f"ignore_eos (default: {d.eos_after_tokens})")
    parser.add_argument("--no-stream-usage", dest="stream_usage", action="store_false", default=None,
                        help="never send usage in streams, even when asked (like servers without "
                        "stream_options.include_usage)")
    parser.add_argument("--api-key", metavar="KEY",
                        help="answer /v1 requests only with 'Authorization: Bearer KEY' (as vLLM's --api-key)")
    for flag, attr, text in _PERF_FLAGS:
        parser.add_argument(flag, type=float, metavar="TOKENS" if attr == "accept_length" else "MS",
                            help=f"{text} (default: {getattr(d.perf, attr)})")
    parser.add_argument("--sleep-seconds", type=_duration, metavar="DURATION",
                        help=f"time the emulated engine takes to park (a vLLM sleep, an SGLang release; default "
                        f"{d.sleep_seconds}s)")
    parser.add_argument("--wake-seconds", type=_duration, metavar="DURATION",
                        help=f"time it takes to take its memory back (a wake, a resume; default {d.wake_seconds}s)")
    parser.add_argument("--reload-seconds", type=_duration, metavar="DURATION",
                        help="time a weight reload takes (vLLM's reload_weights, SGLang's update_weights_from_disk; "
                        "default: half of --startup-seconds, the loading share)")
    parser.add_argument("--drain-seconds", type=float, metavar="SECONDS",
                        help="slow to drain: after SIGTERM the server goes no sooner than this (where its engine "
                        "drains, its drain lasts at least this long; else what ran is ended at once and it lingers); "
                        f"default {d.drain_seconds}")
    parser.add_argument("--misbehave", action="append", choices=MISBEHAVIOURS, metavar="NAME",
                        help="switch on a misbehaviour of the emulated engine's park endpoints (repeatable): "
                        f"{', '.join(MISBEHAVIOURS)}; see docs/sim-server.md")
    parser.add_argument("--emulate", choices=EMULATED,
                        help="take an engine's own arguments, after '--', read by that engine's rules (its "
                        "--port, model, speculative settings); see docs/sim-server.md")
    parser.add_argument("--patched-flag", metavar="NAME",
                        help="with --emulate: the engine is patched to take --NAME T (speculate while the batch is "
                        "at most T), as the seed's --speculative-disable-batch-threshold")
    parser.add_argument("--engine-version", metavar="VERSION",
                        help="with --emulate: the engine version the server reports (vLLM's /version, SGLang's "
                        "/get_server_info)")
    parser.add_argument("engine_args", nargs=argparse.REMAINDER, metavar="-- ENGINE-ARGS",
                        help="with --emulate: the engine's arguments, as after 'vllm' or 'python -m "
                        "sglang.launch_server'")


#: what an emulated engine's arguments set, which the simulator's own flags must then leave alone
_ENGINE_SET = ("host", "port", "model", "mode", "spec_disable_threshold", "api_key", "max_running_requests")


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """Build and validate a :class:`ServerConfig`; ValueError on a bad value."""
    given = {f.name: getattr(args, f.name) for f in fields(ServerConfig)
             if f.name not in ("perf", "engine_info", "engine_warnings", "engine_park", "engine_shutdown")
             and getattr(args, f.name, None) is not None}
    if "misbehave" in given:
        given["misbehave"] = tuple(dict.fromkeys(given["misbehave"]))
    perf = {attr: getattr(args, attr) for _, attr, _ in _PERF_FLAGS
            if getattr(args, attr, None) is not None}
    engine_args = list(getattr(args, "engine_args", None) or [])
    if engine_args[:1] == ["--"]:
        engine_args = engine_args[1:]
    emulate = given.get("emulate")
    if emulate is None and (engine_args or given.get("engine_version") is not None
                            or given.get("patched_flag") is not None):
        raise ValueError("arguments after the simulator's flags (and --engine-version, --patched-flag) need "
                         "--emulate " + "|".join(EMULATED))
    if emulate is not None:
        both = sorted(k for k in _ENGINE_SET if k in given)
        if both:
            raise ValueError(f"with --emulate, the engine's arguments set {', '.join(both)}: leave out the "
                             "simulator's flags for them")
        engine = settings(emulate, engine_args, version=given.get("engine_version"),
                          max_batch=ServerConfig.max_running_requests, read_file=_read_text,
                          patched_flag=given.get("patched_flag"))
        given.update(engine.values, engine_info=engine.info, engine_warnings=engine.warnings,
                     engine_park=engine.park,
                     engine_shutdown=engine.shutdown)
    config = ServerConfig(**given, perf=PerfParams(**perf))
    config.validate()
    return config


def _read_text(path: str) -> str:
    try:
        with open(Path(path), "rb") as f:
            data = f.read(1024 * 1024 + 1)
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    return data.decode(errors="replace")
