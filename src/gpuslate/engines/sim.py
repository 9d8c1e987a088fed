"""gpuslate's own simulated server (``gpuslate sim serve``), as an engine.

Its speculation switch is its own ``--spec-disable-threshold T``, a flag no
real engine takes. With ``--emulate ENGINE -- ARGS`` it plays another engine
under that engine's arguments (docs/sim-server.md): the command is then read
as that engine's (:meth:`Sim.delegate`), and the running server reports the
emulated engine, flagged simulated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .._version import __version__
from .args import OptionTable, Style, scan
from .base import (
    Answers,
    Counters,
    Emulated,
    Example,
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
    fact_value,
)

NAME = "sim"
REPORTED = "gpuslate-sim"  # the engine name its server reports (bench documents, points)
FACTS = ("mode", "spec_disable_threshold", "time_scale", "switch_ms", "patched_flag")
OPTIONS = OptionTable(Style.EXACT, valued=(("--mode",), ("--spec-disable-threshold",), ("--emulate",), ("--port",),
                                           ("--host",), ("--model",), ("--engine-version",), ("--patched-flag",)))


#: its own: it listens at once and answers 503 while it loads; SIGTERM ends what is in flight and it exits
#: (docs/sim-server.md, Lifecycle). Its workers only hold memory: their death is not watched.
LIFECYCLE = Lifecycle(listening=Listening.AT_ONCE, shutdown=Shutdown(on_term=OnTerm.IMMEDIATE),
                      health_paths=("/health", "/health_generate"), source="docs/sim-server.md")


class Sim:
    name = NAME
    title = "gpuslate's simulator"
    owned_by = REPORTED
    launch = Launch(programs=(("gpuslate", ("sim", "serve")),), modules=(("gpuslate", ("sim", "serve")),))
    options = OPTIONS
    readiness = Readiness(("/health_generate",), "GET /health_generate answers 200 (a 1-token generation)")
    lifecycle = LIFECYCLE
    knobs = ()
    park = None
    counters = Counters(info_path="/get_server_info")
    continuous_usage = True
    probes = ("/get_server_info", "/server_info")
    files = ()
    plays_others = True
    reported = REPORTED
    facts = FACTS

    def delegate(self, argv: tuple[str, ...], start: int) -> tuple[str, int] | None:
        """``--emulate ENGINE -- ARGS``: the engine played and where its arguments start."""
        s = scan(argv, start, OPTIONS)
        emulated = s.value("--emulate")
        if emulated is None:
            return None
        sep = argv.index("--", start) if "--" in argv[start:] else len(argv)
        return emulated, sep + 1

    def read(self, argv: tuple[str, ...], start: int, facts: Mapping[str, Any],
             read_file: ReadFile | None) -> SpecCommand:
        s = scan(argv, start, OPTIONS)
        if s.value("--emulate") is not None:
            return SpecCommand(argv, NAME, start=start, missing=(
                f"--emulate {s.value('--emulate')}: no engine of that name, or no engine arguments after '--'",))
        if s.value("--mode") != "speculative":
            return SpecCommand(argv, NAME, start=start,
                               missing=("--mode speculative: the simulated server does not speculate",))
        return SpecCommand(argv, NAME, start=start, drop=tuple(s.spans("--spec-disable-threshold")))

    def version_status(self, version: str | None) -> tuple[VersionStatus, str]:
        return VersionStatus.HAS_KNOB, "any gpuslate simulator (--spec-disable-threshold)"

    def write(self, cmd: SpecCommand, threshold: int, *, top: int, out_dir: str) -> Written:
        return Written({}, ("--spec-disable-threshold", str(threshold)),
                       measured="the simulated server in speculative mode against its baseline mode",
                       does=(f"the simulator's own --spec-disable-threshold {threshold} (a flag of gpuslate's "
                             f"simulator, which no engine takes): speculative steps while the batch is at most "
                             f"{threshold}, baseline steps above"))

    def reference(self, k: int, threshold: int | None, top: int) -> tuple[str, Any]:
        # the threshold as a flag of the seed's kind takes it (--speculative-disable-batch-threshold N)
        return "disable_batch_threshold", threshold

    def identify(self, answers: Answers) -> dict[str, Any] | None:
        for path in self.probes:
            doc = answers.doc(path)
            if not isinstance(doc, dict) or not doc.get("simulated"):
                continue
            emulated = doc.get("emulates")
            if isinstance(emulated, str) and emulated:
                version = doc.get("engine_version")
                facts: dict[str, Any] = {"engine": emulated, "version": version if fact_value(version) else None,
                                         "info_path": path, "simulated": True}
            else:
                facts = {"engine": REPORTED, "version": __version__, "info_path": path}
            facts.update({k: doc[k] for k in FACTS if k in doc and fact_value(doc[k])})
            return facts
        return None

    def emulate(self, argv: Sequence[str], *, version: str | None, max_batch: int,
                read_file: ReadFile) -> Emulated:
        raise ValueError("the simulator does not emulate itself: give its own flags")

    def not_taken(self, facts: Mapping[str, Any]) -> str | None:
        return None

    def example(self, *, model: str, draft: str, port: int, gpus: int, steps: int, folder: str) -> Example | None:
        return None


ENGINE = Sim()
