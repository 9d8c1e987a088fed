"""The output of ``sim init`` and ``sim leak``, here or from another host's document (see
:mod:`.results`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._parse import format_gpu_list, format_size
from .plain import safe

if TYPE_CHECKING:
    from ...gpu.simhost.results import SimInitResult, SimLeakResult


def show_init(result: SimInitResult) -> None:
    """``sim init``'s result, here or from another host's document."""
    print(f"Simulated host at {safe(result.root)}: {result.gpus} × {safe(result.name)} "
          f"({format_size(result.memory)}, NVML memory API {safe(result.memory_api)}), "
          f"release delay {result.release_delay} s")
    print(f"Use it with:  export GPUSLATE_SIM={safe(result.root)}   (or --sim {safe(result.root)})")


def show_leak(result: SimLeakResult) -> None:
    """``sim leak``'s result, here or from another host's document."""
    print(f"Leaked {result.memory} bytes on simulated GPU {format_gpu_list([result.gpu])} (held by no process "
          "until the next 'gpuslate sim init')")
