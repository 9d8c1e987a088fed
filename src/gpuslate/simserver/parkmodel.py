"""How the emulated engines park, as pure decisions (the HTTP side is :mod:`.park`).

Two styles (:class:`~gpuslate.engines.base.ParkStyle`), each an engine's behaviour read in its sources
(cited in docs/units.md, "Park and resume"); which engine parks in which style, with which tags,
levels, routes and known hazards, is the engine module's (``Engine.park``), never this module's:

* **sleep** (vLLM's) (``--enable-sleep-mode``; the endpoints only with ``VLLM_SERVER_DEV_MODE=1``):
  ``POST /sleep?level=1`` copies the weights to CPU memory and discards the KV cache; ``level=2``
  discards both (the model's buffers kept on the CPU); ``level=0`` only pauses scheduling. Before
  it sleeps the engine pauses its scheduler by ``mode``: ``abort`` (the default: requests in flight
  end with ``finish_reason: "abort"``), ``wait`` (they finish first; new ones wait) or ``keep``
  (they freeze and go on after the wake). A second sleep is a no-op ("Executor is already
  sleeping."). ``POST /wake_up`` (optional ``tags=weights`` / ``tags=kv_cache``, repeatable) maps
  the memory back (level 1: the weights copied back; level 2: "remapped empty", so the weights must
  be loaded again: ``POST /collective_rpc {"method": "reload_weights"}``); a tag that is not
  sleeping makes the whole call a no-op; every wake resumes the scheduler. ``GET /is_sleeping`` is
  true while any tag sleeps or scheduling is paused. Requests that arrive while it sleeps wait in
  the paused scheduler. The pools only track what the cumem allocator made: without
  ``--enable-sleep-mode`` (or with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, vLLM PR
  #11743) a sleep answers 200 and frees nothing; the CUDA context and the CUDA graphs (captured
  outside the pools) stay as the residue.
* **release** (SGLang's, ``--enable-memory-saver``): ``POST /release_memory_occupation`` and
  ``/resume_memory_occupation`` with ``tags`` among ``kv_cache``, ``weights``, ``cuda_graph`` (none:
  all). Release asserts that no request is running: with requests in flight the assertion kills
  the scheduler and the server with it. Resuming a tag that was not released is a ``KeyError`` in
  the scheduler: the server dies too. The weights are *released, not offloaded* (#19442): after a
  resume they are whatever the new memory holds, until ``POST /update_weights_from_disk
  {"model_path": ...}`` loads them again, unless ``--enable-weights-cpu-backup`` kept a copy in CPU
  memory (#10873). Without ``--enable-memory-saver`` the calls answer 200 and free nothing (a no-op
  adapter). Only the CUDA context stays.

Each engine's misbehaviours that gpuslate must catch can be switched on (:data:`MISBEHAVIOURS`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from enum import Enum

#: a parkable worker's memory on each GPU, as the engines tag it (shares of ``--memory``): the
#: CUDA context (never released), the CUDA graphs (SGLang's ``cuda_graph`` tag; outside vLLM's
#: pools, so part of its residue), the weights and the KV cache. 5% of residue is about the
#: 1.14 GB of a 4x3090 vLLM 0.13 of vLLM #32714.
REGIONS: tuple[tuple[str, float], ...] = (("context", 0.03), ("cuda_graph", 0.02), ("weights", 0.40),
                                          ("kv_cache", 0.55))
#: the tags every parking engine has: its weights (what a copy in host memory keeps, what a reload
#: loads) and its KV cache (what a leaking park keeps on the GPU)
WEIGHTS, KV_CACHE = "weights", "kv_cache"


class Misbehaviour(Enum):
    """What goes wrong in the wild, each from an upstream report (docs/sim-server.md lists them)."""

    LEAK = "leak-after-sleep"  # the KV cache stays held after a sleep that says 200 (vLLM #32714, #47654)
    EARLY_RETURN = "early-return"  # the call answers before the memory is free (SGLang's release)
    CRASH_IN_FLIGHT = "crash-in-flight"  # a sleep with requests in flight: illegal memory access (vLLM #28714)
    WRONG_WEIGHTS = "wrong-weights"  # the weights come back garbage: other tokens for the same prompt
    EMPTY_WEIGHTS = "empty-weights"  # the weights come back zeros: one token repeated
    FREES_NOTHING = "frees-nothing"  # as with expandable_segments (vLLM PR #11743)


MISBEHAVIOURS = tuple(m.value for m in Misbehaviour)


class Weights(Enum):
    """What the weights on the GPU hold."""

    LOADED = "loaded"  # the model: the reference tokens
    EMPTY = "empty"  # zeros (memory remapped empty): every position the same token
    GARBAGE = "garbage"  # whatever the new memory held: other tokens


@dataclass
class ParkState:
    """One engine's park state."""

    released: set[str] = field(default_factory=set)  # tags whose memory is off the GPU
    sleeping: set[str] = field(default_factory=set)  # vLLM's sleeping tags / SGLang's offload_tags
    paused: bool = False  # sleep: scheduling paused (from the sleep to the wake)
    offloaded: bool = False  # the weights' copy in host memory
    level: int | None = None  # sleep: the level of the current sleep
    weights: Weights = Weights.LOADED
    garbage_seed: int = 0  # the garbage the weights hold (for the text)
    woke_from: int | None = None  # sleep: the level of the last sleep whose weights were woken (a hazard's)

    @property
    def is_sleeping(self) -> bool:
        return self.paused or bool(self.sleeping)

    def text_seed(self) -> int:
        """The seed of the generated words: 0 for the model's own tokens (see openai_api.filler_text)."""
        if self.weights is Weights.LOADED:
            return 0
        return -1 if self.weights is Weights.EMPTY else self.garbage_seed

    def come_back(self, how: Weights) -> None:
        self.weights = how
        if how is Weights.GARBAGE:
            self.garbage_seed = random.SystemRandom().randrange(1, 1 << 62)


@dataclass(frozen=True)
class MemoryPlan:
    """What a park call does to memory: the tags released or taken back, and the host copy."""

    release: tuple[str, ...] = ()
    acquire: tuple[str, ...] = ()
    offload: bool = False  # copy the weights into host memory first
    drop_offload: bool = False  # free that copy (after it was copied back)


def sleep(state: ParkState, level: int, tags: tuple[str, ...], *, offloads: bool, frees: bool,
          leak: bool) -> MemoryPlan | None:
    """The sleep style's sleep at ``level`` (0 only pauses): the memory plan, None when it is a no-op
    (already asleep). ``tags``: the engine's; ``offloads``: the level copies the weights into host
    memory; ``frees``: the pools track the memory (the engine's flag given, no hazard that frees
    nothing); ``leak``: the KV cache stays (#32714). Updates ``state``."""
    if state.sleeping:  # "Executor is already sleeping."
        state.paused = True
        return None
    state.paused = True
    if level == 0:
        return MemoryPlan()
    state.level = level
    state.sleeping = set(tags)
    if not frees:
        return MemoryPlan()
    release = tuple(t for t in tags if not (leak and t == KV_CACHE))
    state.released |= set(release)
    state.offloaded = offloads
    return MemoryPlan(release=release, offload=offloads)


def wake(state: ParkState, tags: list[str] | None, *, wrong: Weights | None) -> MemoryPlan | None:
    """The sleep style's wake: None when it is a no-op (not sleeping, or a tag that is not sleeping).
    ``wrong``: the weights come back so (a misbehaviour). Updates ``state``; the scheduler resumes."""
    if not state.sleeping:  # "Executor is not sleeping."; the scheduler still resumes
        state.paused = False
        return None
    wanted = list(dict.fromkeys(tags)) if tags else sorted(state.sleeping)
    if any(t not in state.sleeping for t in wanted):  # "Tag %s is not in sleeping tags %s": nothing done
        return None
    acquire = tuple(t for t in wanted if t in state.released)
    state.released -= set(acquire)
    state.sleeping -= set(wanted)
    state.paused = False
    plan = MemoryPlan(acquire=acquire)
    if WEIGHTS in wanted:
        if state.offloaded:
            state.come_back(wrong or Weights.LOADED)
            plan = MemoryPlan(acquire=acquire, drop_offload=True)
            state.offloaded = False
        elif WEIGHTS in acquire:
            state.come_back(wrong or Weights.EMPTY)  # remapped empty: the weights must be reloaded
            state.woke_from = state.level
        elif wrong is not None:
            state.come_back(wrong)
    if not state.sleeping:
        state.level = None
    return plan


def release_tags(tags: object, known: tuple[str, ...]) -> list[str] | str:
    """The release style's ``tags`` field: the tags (none or empty: all ``known``), or what is wrong with it."""
    if tags is None or tags == []:
        return list(known)
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        return "tags must be a list of strings"
    unknown = [t for t in tags if t not in known]
    if unknown:
        return f"unknown tag {unknown[0]!r}: {', '.join(known)}"
    return list(dict.fromkeys(tags))


def release(state: ParkState, tags: list[str], *, saver: bool, offloads: bool, leak: bool) -> MemoryPlan:
    """The release style's release (requests checked by the caller: the assertion). ``saver``: the
    engine's flag given (else nothing is freed); ``offloads``: the weights kept in host memory."""
    state.sleeping |= set(tags)
    if not saver:
        return MemoryPlan()
    release = tuple(t for t in tags if t not in state.released and not (leak and t == KV_CACHE))
    state.released |= set(release)
    offload = WEIGHTS in release and offloads
    state.offloaded = state.offloaded or offload
    return MemoryPlan(release=release, offload=offload)


def resume(state: ParkState, tags: list[str], *, wrong: Weights | None) -> MemoryPlan | None:
    """The release style's resume; None when a tag was not released: ``offload_tags.remove`` raises
    KeyError in the scheduler, which dies with the server."""
    if any(t not in state.sleeping for t in tags):
        return None
    acquire = tuple(t for t in tags if t in state.released)
    state.sleeping -= set(tags)
    state.released -= set(acquire)
    plan = MemoryPlan(acquire=acquire)
    if WEIGHTS in acquire:
        if state.offloaded:
            state.come_back(wrong or Weights.LOADED)
            state.offloaded = False
            plan = MemoryPlan(acquire=acquire, drop_offload=True)
        else:  # released, not offloaded (#19442): a random tensor until the weights are loaded from disk
            state.come_back(wrong or Weights.GARBAGE)
    elif WEIGHTS in tags and wrong is not None:
        state.come_back(wrong)
    return plan
