"""The output of ``sim init`` and ``sim leak``, here or from another host's document (see
:mod:`.results`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._parse import format_gpu_list, format_size
from .plain import safe

if TYPE_CHECKING:
    from ...gpu.simhost.results import SimInitResult, SimLeakResult


def show_init(result: SimInitResult) -> None:
    """``sim init``'s result, here or from another host's document: short lines (a path, which
    cannot be broken, on a line of its own), so that no terminal wraps one."""
    root = safe(result.root)
    print(f"Simulated host at {root}\n"
          f"  {result.gpus} × {safe(result.name)}, {format_size(result.memory)} each\n"
          f"  NVML memory API {safe(result.memory_api)}, release delay {result.release_delay} s\n"
          f"Use it with:\n  export GPUSLATE_SIM={root}\n  (or --sim {root})")


def show_leak(result: SimLeakResult) -> None:
    """``sim leak``'s result, here or from another host's document."""
    print(f"Leaked {result.memory} bytes on simulated GPU {format_gpu_list([result.gpu])} (held by no process "
          "until the next 'gpuslate sim init')")
