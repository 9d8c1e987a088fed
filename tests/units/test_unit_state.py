"""The pure decisions behind `ps` and the record reader, as hypothesis properties:
the state is total, never `stopped` while strays hold the unit's GPUs, never `starting`
once `up` is gone; a record of any shape is read or refused, never a TypeError."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslate.units import store
from gpuslate.units.state import Phase, UnitFacts, UnitState, needs_readiness_answer, unit_state

facts = st.builds(
    UnitFacts,
    phase=st.one_of(st.none(), st.sampled_from(Phase)),
    main_alive=st.booleans(),
    members_alive=st.booleans(),
    up_alive=st.booleans(),
    ready_answer=st.one_of(st.none(), st.booleans()),
    strays=st.lists(st.integers(1, 2**22), max_size=3).map(tuple),
).filter(lambda f: f.members_alive or not f.main_alive)  # the main process is a member


@given(facts)
def test_state_is_total_and_an_enum(f: UnitFacts) -> None:
    assert isinstance(unit_state(f), UnitState)


@given(facts)
def test_never_stopped_or_exited_while_something_of_it_lives(f: UnitFacts) -> None:
    if f.strays or f.members_alive:
        assert unit_state(f) not in (UnitState.STOPPED, UnitState.EXITED, UnitState.FAILED)


@given(facts)
def test_never_starting_once_up_is_gone(f: UnitFacts) -> None:
    if not f.up_alive:
        assert unit_state(f) != UnitState.STARTING


@given(facts)
def test_corrupt_exactly_when_the_record_is(f: UnitFacts) -> None:
    assert (unit_state(f) == UnitState.CORRUPT) == (f.phase is None)


@given(facts)
def test_ready_or_starting_only_with_a_live_main_process(f: UnitFacts) -> None:
    if unit_state(f) in (UnitState.READY, UnitState.STARTING):
        assert f.main_alive


@given(facts)
def test_a_vanished_up_is_judged_by_the_readiness_answer(f: UnitFacts) -> None:
    asked = needs_readiness_answer(f.phase, f.main_alive, f.up_alive)
    if asked:
        assert unit_state(f) == (UnitState.READY if f.ready_answer else UnitState.ORPHANED)
    else:  # the answer is not looked at when it is not asked for
        assert unit_state(f) == unit_state(UnitFacts(f.phase, f.main_alive, f.members_alive, f.up_alive,
                                                     not f.ready_answer, f.strays))


def test_examples() -> None:
    s = Phase.STARTING
    assert unit_state(UnitFacts(s, True, True, True, None)) == UnitState.STARTING
    assert unit_state(UnitFacts(s, True, True, False, True)) == UnitState.READY
    assert unit_state(UnitFacts(s, True, True, False, False)) == UnitState.ORPHANED
    assert unit_state(UnitFacts(s, False, False, False, None)) == UnitState.EXITED
    assert unit_state(UnitFacts(Phase.STOPPED, False, False, False, None, (42,))) == UnitState.ORPHANED
    assert unit_state(UnitFacts(Phase.STOPPED, False, False, False, None)) == UnitState.STOPPED
    assert unit_state(UnitFacts(Phase.READY, False, True, False, None)) == UnitState.ORPHANED


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)
GOOD = {"schema": store.SCHEMA, "name": "u", "spec": {"name": "u", "command": ["x"], "port": 1}, "phase": "ready",
        "pid": 10, "start_ticks": 5, "pgid": 10, "sid": 10, "containment": "session", "cgroup": None,
        "log": "/tmp/u.log", "gpus": [0], "port": 1, "env": {}, "launched_at": 1.0, "instance": "a1" * 16}


@settings(max_examples=300)
@given(st.sampled_from(sorted(GOOD)), json_values)
def test_a_record_with_any_field_value_is_read_or_refused(key: str, value: object) -> None:
    doc = {**GOOD, key: value}
    try:
        rec = store.UnitRecord.from_json(doc)
    except store.CorruptRecord as exc:
        assert key in str(exc)
    else:  # what is accepted is usable: every field has the type the code relies on
        assert isinstance(rec.pid, int) and isinstance(rec.gpus, list) and isinstance(rec.phase, Phase)
        assert rec.cgroup is None or rec.cgroup.startswith("/")


@given(st.sampled_from(sorted(set(GOOD) - {"schema"})))
def test_a_missing_required_field_is_named(key: str) -> None:
    doc = dict(GOOD)
    del doc[key]
    try:
        store.UnitRecord.from_json(doc)
    except store.CorruptRecord as exc:
        assert repr(key) in str(exc)


@given(st.integers(0, len(json.dumps(GOOD))))
def test_a_torn_record_still_reads_what_it_can(cut: int) -> None:
    text = json.dumps(store.UnitRecord.from_json(GOOD).to_json())[:cut]  # as written: the instance early
    got = store.salvage(text)
    for key, value in got.items():
        assert key in ("pid", "start_ticks", "port", "cgroup", "launched_at", "gpus", "instance")
        if key in ("pid", "start_ticks"):
            assert value == GOOD[key] or str(GOOD[key]).startswith(str(value))
        if key == "instance":  # whole or not at all: a cut id would name another instance
            assert value == GOOD["instance"]


@settings(max_examples=200)
@given(st.sampled_from(["command", "env", "gpus", "port", "host", "engine", "ready_log", "smoke", "grace"]),
       json_values)
def test_a_spec_of_any_shape_in_a_record_is_read_or_refused(key: str, value: object) -> None:
    from gpuslate.units.spec import UnitSpec

    doc = {**GOOD, "spec": {**GOOD["spec"], key: value}}
    try:
        rec = store.UnitRecord.from_json(doc)
    except store.CorruptRecord as exc:
        assert "'spec'" in str(exc)
    else:
        try:  # what Unit.load does with it: valid, or a clear refusal
            UnitSpec.from_json(rec.spec).validate()
        except ValueError:
            pass


@given(st.dictionaries(st.sampled_from(sorted(GOOD)), json_values, max_size=8))
def test_what_is_salvaged_from_a_parsed_record_has_the_right_types(doc: dict) -> None:
    got = store.salvage_doc(doc)
    assert all(isinstance(v, int) and not isinstance(v, bool) for k, v in got.items() if k in ("pid", "port"))
    assert all(isinstance(g, int) for g in got.get("gpus", []))
