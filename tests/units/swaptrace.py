"""A trace of which gpuslate modules a call enters, phase by phase (for the swap-path test).

A *phase* is one call of a verb (``down``, ``up``) made during a ``swap``. Within a
phase, a module is *entered* when a gpuslate frame of it is called from a gpuslate
frame of another module (frames outside gpuslate, such as ``contextlib``, are
transparent); it is *re-entered* when, at that moment, the module is already on
the stack below the caller: the path went down into another module and climbed
back into this one. "Each module once per phase" means no re-entry: reading the
code top-down, each module is visited in one piece.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import gpuslate

PKG = str(Path(gpuslate.__file__).parent) + "/"


class Trace:
    def __init__(self, phases: dict[str, tuple[str, str]], root: str = PKG) -> None:
        """``phases``: phase name -> (module path under ``root``, function name) whose call opens it."""
        self.root = root
        self.phases = {v: k for k, v in phases.items()}
        self.entries: dict[str, Counter[str]] = {}
        self.reentries: dict[str, Counter[str]] = {}
        self.order: list[str] = []
        self.paths: dict[str, str] = {}  # module -> one call path that re-entered it
        self._thread = threading.get_ident()

    def module_of(self, frame: FrameType) -> str | None:
        path = frame.f_code.co_filename
        return path[len(self.root):] if path.startswith(self.root) else None

    def _chain(self, frame: FrameType | None) -> Iterator[tuple[str, FrameType]]:
        while frame is not None:
            m = self.module_of(frame)
            if m is not None:
                yield m, frame
            frame = frame.f_back

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or threading.get_ident() != self._thread:
            return
        mod = self.module_of(frame)
        if mod is None:
            return
        chain = list(self._chain(frame.f_back))
        phase = None
        for m, f in chain:  # the innermost phase on the stack
            phase = self.phases.get((m, f.f_code.co_name))
            if phase is not None:
                break
        opens = self.phases.get((mod, frame.f_code.co_name))
        if opens is not None:
            self.order.append(opens)
            return
        if phase is None or not chain or chain[0][0] == mod:
            return
        self.entries.setdefault(phase, Counter())[mod] += 1
        below: list[str] = []
        for m, f in chain:
            if self.phases.get((m, f.f_code.co_name)) == phase:
                break
            below.append(m)
        if mod in below:
            self.reentries.setdefault(phase, Counter())[mod] += 1
            where = " <- ".join(f"{m}:{f.f_code.co_name}" for m, f in chain[:below.index(mod) + 1])
            self.paths.setdefault(mod, where)


@contextmanager
def traced(phases: dict[str, tuple[str, str]], root: str = PKG) -> Iterator[Trace]:
    trace = Trace(phases, root)
    sys.setprofile(trace)
    try:
        yield trace
    finally:
        sys.setprofile(None)
