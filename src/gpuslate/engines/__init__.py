"""The model servers gpuslate knows: one module per engine, one registry.

Each engine module (:mod:`.vllm`, :mod:`.sglang`, :mod:`.trtllm`, and :mod:`.sim`,
gpuslate's own simulated server) implements :class:`~.base.Engine`: how its
command line is recognised and read by its own parser's rules (abbreviations
included where its parser takes them, an ambiguous one a blocker named as such),
its blockers and the versions that have each knob, how a running server says
what it is, how the recommendation is written in its form (files and the whole
command line), its readiness for units, and how it parks and resumes where it
can. :mod:`.registry` is the one list; no other module names an engine
(``tests/engines/test_engine_registry.py`` holds that). The upstream sources
these rules come from are cited in docs/experiment.md.

Pure and light (the standard library; PyYAML only to read a TensorRT-LLM
options file): units, the load generator, the report and the simulator import it.
"""

from __future__ import annotations

from .args import OptionTable, Scan, Style, scan
from .base import (
    COMMAND_FILE,
    Answers,
    ApplyPlan,
    ApplyStatus,
    Blocker,
    Emulated,
    Engine,
    HazardEffect,
    Knob,
    Park,
    ParkHazard,
    ParkLevel,
    ParkReading,
    ParkStyle,
    ReadFile,
    Readiness,
    SpecCommand,
    VersionStatus,
)
from .commands import (
    by_reported,
    detect,
    engine,
    engine_files,
    engine_of,
    names,
    no_switch_sentence,
    park_reading,
    plan_apply,
    plan_as_measured,
    plan_patched,
    read_command,
    read_park,
    reference_forms,
)
from .registry import BACKENDS, SEED_ENGINE

__all__ = [
    "BACKENDS", "COMMAND_FILE", "SEED_ENGINE", "Answers", "ApplyPlan", "ApplyStatus", "Blocker", "Emulated",
    "Engine", "HazardEffect", "Knob", "OptionTable", "Park", "ParkHazard", "ParkLevel", "ParkReading", "ParkStyle",
    "ReadFile", "Readiness", "Scan", "SpecCommand", "Style", "VersionStatus", "by_reported", "detect", "engine",
    "engine_files", "engine_of", "names", "no_switch_sentence", "park_reading", "plan_apply", "plan_as_measured",
    "plan_patched", "read_command", "read_park", "reference_forms", "scan",
]
