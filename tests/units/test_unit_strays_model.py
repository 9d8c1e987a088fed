"""The pure decision behind strays, ``strays.decide``, against random candidates (issue 24):

* a stray is never another user's process, one whose owner is unknown, a zombie, a process found
  in a unit (this one or another), one carrying another instance's marker, one started before the
  unit's launch or in or after the tick of its stop;
* it holds memory on one of the unit's GPUs, or listens on the unit's port, or holds memory on
  another GPU with an environment that is not intact; one with an intact environment and no
  marker, holding only another GPU, is ruled out;
* a damaged environment never rules a process out where an intact one would make it a stray
  (unknown never narrows what is reported), and strays are what they are alone: adding candidates
  never changes another's verdict.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpuslate.units.fence import Marker
from gpuslate.units.strays import Candidate, Rule, StrayReason, decide, reason

ME = 1000

rules = st.builds(Rule, st.sampled_from([ME, 0]), st.integers(0, 100),
                  st.one_of(st.none(), st.floats(0, 200, allow_nan=False)),
                  st.frozensets(st.integers(0, 3), max_size=3), st.one_of(st.none(), st.integers(1, 65535)))
candidates = st.builds(Candidate, st.integers(1, 40), st.integers(0, 200), st.just("w"), st.booleans(),
                       st.sampled_from([ME, 0, 2000, None]), st.booleans(), st.sampled_from(list(Marker)),
                       st.dictionaries(st.integers(0, 5), st.integers(0, 3), max_size=3), st.booleans(),
                       st.sampled_from(list(Marker)))


@given(rules, st.lists(candidates, max_size=12))
def test_a_stray_is_only_what_cannot_be_ruled_out(rule, cands):
    out = decide(rule, cands)
    assert [s.pid for s in out] == sorted({s.pid for s in out})
    first = {}
    for c in cands:
        first.setdefault(c.pid, c)
    for s in out:
        c = first[s.pid]
        assert not c.exited and not c.claimed and c.uid == rule.caller_uid and c.marker != Marker.FOREIGN
        assert rule.since <= c.start_ticks and (rule.until is None or c.start_ticks < int(rule.until))
        held = {g for g, b in c.memory.items() if b > 0}
        assert s.gpus == sorted(held) and s.used_memory == sum(c.memory[g] for g in held)
        if s.reason == StrayReason.UNIT_GPU:
            assert held & rule.gpus
        elif s.reason == StrayReason.UNIT_PORT:
            assert c.listens and rule.port is not None and s.port == rule.port and not held & rule.gpus
        else:  # and a session whose leader is not shown (intact, unmarked or another unit's) to be another's
            assert held and not held & rule.gpus and c.marker == Marker.NOT_INTACT
            assert c.leader not in (Marker.NONE, Marker.FOREIGN)
    # each candidate's verdict is its own: the others change nothing
    for pid, c in first.items():
        alone = decide(rule, [c])
        assert [s for s in out if s.pid == pid] == alone


@given(rules, candidates)
def test_an_environment_that_is_not_intact_never_rules_out(rule, c):
    """Whatever an intact environment (with or without a marker of ours) would make a stray, one
    that is not intact makes a stray too; only another instance's marker rules a process out by
    itself."""
    for marker in (Marker.NONE, Marker.OURS, Marker.NAMED, Marker.UNREAD):
        if reason(rule, c._replace(marker=marker)) is not None:
            assert reason(rule, c._replace(marker=Marker.NOT_INTACT)) is not None
    assert reason(rule, c._replace(marker=Marker.FOREIGN)) is None


def test_the_three_reasons():
    rule = Rule(ME, 10, 100.0, frozenset({0}), 8000)
    base = Candidate(5, 50, "w", False, ME, False, Marker.NONE, {})
    assert reason(rule, base._replace(memory={0: 1})) == StrayReason.UNIT_GPU
    assert reason(rule, base._replace(listens=True)) == StrayReason.UNIT_PORT
    assert reason(rule, base._replace(memory={1: 1})) is None  # intact, no marker: a program of the caller's
    assert reason(rule, base._replace(memory={1: 1}, marker=Marker.NOT_INTACT)) == StrayReason.OTHER_GPU
    # ... unless its session's leader, intact and unmarked, shows whose it is (a shell of the caller's)
    assert reason(rule, base._replace(memory={1: 1}, marker=Marker.NOT_INTACT, leader=Marker.NONE)) is None
    assert reason(rule, base._replace(memory={1: 1}, marker=Marker.NOT_INTACT, leader=Marker.OURS)) == \
        StrayReason.OTHER_GPU
    assert reason(rule, base._replace(memory={0: 1}, start_ticks=100)) is None  # in the tick of the stop
    assert reason(rule, base._replace(memory={0: 1}, start_ticks=9)) is None  # before the launch
    assert reason(rule, base._replace(memory={0: 1}, uid=2000)) is None  # another user's


@given(rules, st.lists(candidates, max_size=12))
def test_a_stray_blocks_only_what_the_units_next_up_needs(rule, cands):
    """Issue 32: a stray keeps down NOT verified only on the unit's GPUs or port (the next up would
    collide); one on another GPU is a warning. Every stray is named with a command that ends it, which
    gpuslate never runs itself (a stray is proven nothing: down signals only its fence's members)."""
    for s in decide(rule, cands):
        assert s.blocking == (s.reason in (StrayReason.UNIT_GPU, StrayReason.UNIT_PORT))
        assert s.blocking or (s.gpus and not set(s.gpus) & rule.gpus)
        assert s.remedy() == (f"gpuslate clear --pid {s.pid}" if s.gpus else f"kill {s.pid}")
