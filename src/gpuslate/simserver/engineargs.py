"""``sim serve --emulate ENGINE -- ARGS``: the simulated server taking an engine's own arguments.

So that an experiment can declare a deployment exactly as it would run it on
GPUs (``vllm serve MODEL --speculative-config '{...}'``, ``python -m
sglang.launch_server ... --speculative-algorithm EAGLE3``, ``trtllm-serve MODEL
--extra_llm_api_options FILE.yaml``) and run it on a machine without GPUs, the
simulator reads the engine's arguments the way the engine does: each engine's
module in :mod:`gpuslate.engines` (its ``emulate``) applies the engine's own
rules, its parser's included (abbreviations where it takes them, an ambiguous
one refused), and maps them onto the model: speculation on or off per batch
size, i.e. ``--spec-disable-threshold``. A configuration the engine would
refuse is refused (one line, exit 2); one the engine would ignore is ignored
with the engine's own warning line. The rules and their sources are in
docs/sim-server.md and docs/experiment.md.

A *patched* engine (``--patched-flag NAME``) also takes the seed's kind of flag,
``NAME T``: speculate while the batch is at most T, not above; it wins over the
engine's own schedule, as the seed's patch skipped drafting by itself.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..engines import BACKENDS, ParkReading, engine, park_reading, scan
from ..engines.args import int_arg
from ..engines.base import Shutdown

#: the engines the simulator can play (all but itself)
EMULATED = tuple(name for name, e in BACKENDS.items()
                 if e.example(model="m", draft="d", port=1, gpus=1, steps=1, folder="/") is not None)


@dataclass(frozen=True)
class EngineSettings:
    """What the engine's arguments set on the simulated server."""

    values: dict[str, Any]  # ServerConfig fields: host, port, model, mode, spec_disable_threshold, api_key, ...
    info: dict[str, Any] = field(default_factory=dict)  # the engine's own facts for /get_server_info
    warnings: tuple[str, ...] = ()  # the engine's log lines about what it ignored or disabled
    park: ParkReading | None = None  # how the engine parks under these arguments (None: it cannot)
    shutdown: Shutdown | None = None  # what SIGTERM does under these arguments (None: as the engine does)


def settings(name: str, argv: Sequence[str], *, version: str | None, max_batch: int,
             read_file: Callable[[str], str], patched_flag: str | None = None) -> EngineSettings:
    """The simulated server's settings from engine ``name``'s command-line arguments (after the
    program). ``read_file`` reads a file the arguments name (SGLang's adaptive config, TensorRT-LLM's
    options file). ValueError: refused."""
    e = engine(name)
    if e is None or name not in EMULATED:
        raise ValueError(f"--emulate must be one of {', '.join(EMULATED)}, got {name!r}")
    flag = None if patched_flag is None else "--" + patched_flag.lstrip("-")
    args = list(argv)
    patched_t = None
    if flag is not None:  # the patched flag is the engine's own option: read by its parser, then taken out
        s = scan(args, 0, e.options.with_valued(flag))
        patched_t = int_arg(s, flag, None)
        if patched_t is not None and patched_t < 0:
            raise ValueError(f"argument {flag}: must be >= 0, got {patched_t}")
        spans = s.spans(flag)
        args = [a for i, a in enumerate(args) if not any(lo <= i < hi for lo, hi in spans)]
    em = e.emulate(args, version=version, max_batch=max_batch, read_file=read_file)
    values: dict[str, Any] = {"port": em.port, "model": em.model}
    for key, value in (("host", em.host), ("api_key", em.api_key), ("max_running_requests", em.max_running)):
        if value is not None:
            values[key] = value
    info = dict(em.info)
    if em.speculative:
        values["mode"] = "speculative"
        threshold = em.threshold
        if patched_t is not None:
            threshold = patched_t
            info["patched_flag"] = flag
        if threshold is not None:
            values["spec_disable_threshold"] = threshold
    return EngineSettings(values, info, em.warnings, park=park_reading(e, tuple(args), 0, os.environ),
                          shutdown=em.shutdown)
