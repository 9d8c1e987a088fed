"""The engines gpuslate knows, one line each: the only list of them.

Adding an engine is one module in this package implementing
:class:`~gpuslate.engines.base.Engine` and one line here; everything that
names engines (a unit's ``engine``, ``up --engine``, ``sim serve --emulate``,
``demo --engine``, what ``bench`` records, the experiment report, the
simulator's emulation) reads this dict.
"""

from __future__ import annotations

from . import sglang, sim, trtllm, vllm
from .base import Engine

BACKENDS: dict[str, Engine] = {
    vllm.NAME: vllm.ENGINE,
    sglang.NAME: sglang.ENGINE,
    trtllm.NAME: trtllm.ENGINE,
    sim.NAME: sim.ENGINE,
}

#: the engine of the seed's story (EAGLE-3 on 8 GPUs): ``gpuslate demo``'s default
SEED_ENGINE = sglang.NAME
