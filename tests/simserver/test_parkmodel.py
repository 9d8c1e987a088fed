"""The park styles' rules, pure: model tests over random call sequences (the HTTP side: test_park.py).
The tags and levels are the engines' own facts (``Engine.park``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpuslate.engines import BACKENDS
from gpuslate.simserver.parkmodel import ParkState, Weights, release, release_tags, resume, sleep, wake

VLLM_TAGS = BACKENDS["vllm"].park.tags
SGLANG_TAGS = BACKENDS["sglang"].park.tags


def vllm_sleep(s: ParkState, level: int, *, frees: bool, leak: bool):
    return sleep(s, level, VLLM_TAGS, offloads=level == 1, frees=frees, leak=leak)


vllm_wake = wake


def sglang_tags(tags: object):
    return release_tags(tags, SGLANG_TAGS)


def sglang_release(s: ParkState, tags: list[str], *, saver: bool, cpu_backup: bool, leak: bool):
    return release(s, tags, saver=saver, offloads=cpu_backup, leak=leak)


sglang_resume = resume

vllm_calls = st.lists(st.one_of(
    st.tuples(st.just("sleep"), st.sampled_from([0, 1, 2])),
    st.tuples(st.just("wake"), st.one_of(st.none(), st.lists(st.sampled_from(VLLM_TAGS), min_size=1, max_size=2))),
), max_size=12)


@given(vllm_calls, st.booleans())
def test_vllm_memory_is_off_the_gpu_only_while_its_tag_sleeps(calls, frees: bool) -> None:
    s = ParkState()
    off: set[str] = set()  # what the plans released and did not take back
    for call, arg in calls:
        plan = vllm_sleep(s, arg, frees=frees, leak=False) if call == "sleep" else vllm_wake(s, arg, wrong=None)
        if plan is not None:
            off |= set(plan.release)
            off -= set(plan.acquire)
        assert s.released == off and s.released <= s.sleeping  # memory follows the plans, never ahead
        assert s.is_sleeping == (s.paused or bool(s.sleeping))
        if not frees:
            assert not s.released  # the pools track nothing: nothing ever leaves
    plan = vllm_wake(s, None, wrong=None)  # a full wake brings everything back and resumes
    assert not s.sleeping and not s.released and not s.paused and not s.is_sleeping


@given(st.sampled_from([1, 2]))
def test_vllm_level_1_comes_back_loaded_level_2_empty_until_reload(level: int) -> None:
    s = ParkState()
    plan = vllm_sleep(s, level, frees=True, leak=False)
    assert plan is not None and plan.offload == (level == 1) and set(plan.release) == set(VLLM_TAGS)
    assert vllm_sleep(s, level, frees=True, leak=False) is None  # already asleep: nothing
    wake = vllm_wake(s, None, wrong=None)
    assert wake is not None and wake.drop_offload == (level == 1)
    assert s.weights is (Weights.LOADED if level == 1 else Weights.EMPTY)
    assert s.text_seed() == (0 if level == 1 else -1)


def test_vllm_a_tag_not_sleeping_makes_the_wake_a_no_op() -> None:
    s = ParkState()
    vllm_sleep(s, 1, frees=True, leak=False)
    assert vllm_wake(s, ["weights"], wrong=None) is not None
    assert vllm_wake(s, ["weights", "kv_cache"], wrong=None) is None  # weights awake already: nothing done
    assert s.sleeping == {"kv_cache"} and s.is_sleeping


sglang_calls = st.lists(st.tuples(st.sampled_from(["release", "resume"]),
                                  st.lists(st.sampled_from(SGLANG_TAGS), max_size=3)), max_size=10)


@given(sglang_calls, st.booleans(), st.booleans())
def test_sglang_resume_of_a_tag_not_released_is_the_servers_end(calls, saver: bool, backup: bool) -> None:
    s = ParkState()
    for call, raw in calls:
        tags = sglang_tags(raw)
        assert isinstance(tags, list) and tags
        if call == "release":
            sglang_release(s, tags, saver=saver, cpu_backup=backup, leak=False)
        else:
            before = set(s.sleeping)
            plan = sglang_resume(s, tags, wrong=None)
            if not set(tags) <= before:
                assert plan is None  # offload_tags.remove: KeyError, the server dies
                return
            assert plan is not None
            if "weights" in plan.acquire:  # released weights come back garbage unless backed up
                assert s.weights is (Weights.LOADED if backup else Weights.GARBAGE)
        assert s.released <= s.sleeping
        if not saver:
            assert not s.released and s.weights is Weights.LOADED  # the no-op adapter


def test_sglang_tags_are_its_three_or_all() -> None:
    assert sglang_tags(None) == list(SGLANG_TAGS) == sglang_tags([])
    assert sglang_tags(["weights", "weights"]) == ["weights"]
    assert isinstance(sglang_tags(["gpu"]), str) and isinstance(sglang_tags("weights"), str)
