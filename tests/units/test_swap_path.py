"""``swap`` runs on one host context: one backend, one lock acquisition, one audit log; and the
path it takes (swap -> down -> up) enters each module of the units, clearing and host layers once
per phase, never climbing back into one it went down from (see swaptrace.py)."""

from __future__ import annotations

import sys
from collections import Counter

import pytest

from gpuslate import Host, SwapOptions, UpOptions
from gpuslate.units import Unit, UnitSpec
from helpers import count_host_opens
from swaptrace import traced
from unitkit import free_port, serve_cmd

PHASES = {"down": ("units/lifecycle.py", "stop_loaded"), "up": ("units/lifecycle.py", "start_checked")}
#: proc/ and gpu/simhost/ below are readers: their generators resume each other
LAYERS = ("units/", "clearing/", "host/")


@pytest.fixture
def counted(monkeypatch):
    """How often a backend is opened, the host lock acquired and an audit log opened."""
    return count_host_opens(monkeypatch)


def specs() -> tuple[UnitSpec, UnitSpec]:
    port = free_port()
    return (UnitSpec("old", command=serve_cmd(port, startup=0.1), gpus=[0], port=port),
            UnitSpec("new", command=serve_cmd(port, startup=0.1), gpus=[0], port=port))


def test_one_swap_one_backend_one_lock_one_audit_log(units_host, counted):
    old, new = specs()
    with Host.open() as host:
        assert host.up(old).ok
    counted.update(backend=0, lock=0, audit=0)
    events: list[str] = []
    with Host.open(on_event=events.append) as host:
        result = host.swap("old", new)
        assert result.ok, result.to_json()
        assert host.lock_depth == 0
    assert counted == {"backend": 1, "lock": 1, "audit": 1}, counted
    assert result.down.timings["lock_wait_s"] == 0 and result.up.timings["lock_wait_s"] == 0
    with Host.open() as host:
        assert host.down("new").ok


def test_the_trace_sees_a_climb_back(tmp_path, monkeypatch):
    """The detector itself: verb -> a -> b -> a is a re-entry of a; verb -> a -> b -> c is none."""
    pkg = tmp_path / "tracepkg"
    pkg.mkdir()
    (pkg / "verb.py").write_text("from tracepkg import a\ndef run(back):\n    return a.f(back)\n")
    (pkg / "a.py").write_text("from tracepkg import b\ndef f(back):\n    return b.g(back)\ndef h():\n    return 1\n")
    (pkg / "b.py").write_text("from tracepkg import a, c\ndef g(back):\n    return a.h() if back else c.k()\n")
    (pkg / "c.py").write_text("def k():\n    return 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from tracepkg import verb

    for back, expected in ((True, {"a.py": 1}), (False, {})):
        with traced({"run": ("verb.py", "run")}, root=str(pkg) + "/") as trace:
            verb.run(back)
        assert trace.order == ["run"]
        assert dict(trace.reentries.get("run", {})) == expected


def test_swap_enters_each_module_once_per_phase(units_host):
    old, new = specs()
    host = Host.open()
    assert host.up(old).ok
    try:
        with traced(PHASES) as trace:
            result = host.swap("old", new)
        assert result.ok, result.to_json()
    finally:
        host.down("new")
    assert trace.order == ["down", "up"]  # each verb once: no nested down/up, no second session
    for phase in ("down", "up"):
        entered = trace.entries[phase]
        assert entered["units/unit.py"] and entered["units/contain.py"] and entered["units/launch.py"]
        climbed = {m: n for m, n in trace.reentries.get(phase, {}).items() if m.startswith(LAYERS)}
        assert not climbed, (phase, climbed, {m: trace.paths[m] for m in climbed})


#: the functions of units/lifecycle.py each phase of a swap runs in (the public verbs before the
#: split, the phase functions after it): a unit loaded in one of them was read again by the phase
STOP_FRAMES, START_FRAMES = {"down", "stop_loaded"}, {"up", "start_checked"}


@pytest.fixture
def record_loads(monkeypatch):
    """Each ``Unit.load`` of one unit by name (not the listing of every unit, ``load_units``: the
    other units' owners), as (phase, name): ``stop``, ``start`` (of NEW), ``rollback`` (a start of
    OLD), or ``swap`` (the verb's own, before any phase)."""
    loads: Counter[tuple[str, str]] = Counter()
    real = Unit.load.__func__

    def load(cls, units, name):
        caller = sys._getframe(1)
        if caller.f_code.co_name != "load_units":
            phase, f = "swap", caller
            while f is not None:
                if f.f_code.co_filename.endswith("units/lifecycle.py"):
                    if f.f_code.co_name in STOP_FRAMES:
                        phase = "stop"
                        break
                    if f.f_code.co_name in START_FRAMES:
                        phase = "rollback" if name == "old" else "start"
                        break
                f = f.f_back
            loads[(phase, name)] += 1
        return real(cls, units, name)

    monkeypatch.setattr(Unit, "load", classmethod(load))
    return loads


def test_swap_reads_each_record_once_and_hands_it_to_its_phases(units_host, record_loads):
    """``swap OLD NEW --rollback`` with a NEW that fails: OLD's record and NEW's are each read once,
    under the lock, by swap itself; the stop of OLD, the start of NEW (resolved by name from its
    last run, as loaded) and the rollback to OLD read neither again."""
    old, _ = specs()
    broken = UnitSpec("new", command=[sys.executable, "-c", "raise SystemExit(3)"], gpus=[0], port=old.port,
                      start_timeout=10)
    with Host.open() as host:
        assert not host.up(broken).ok  # a record with the spec it last ran with: NEW by name resolves from it
        assert host.up(old).ok
    record_loads.clear()
    with Host.open() as host:
        result = host.swap("old", "new", SwapOptions(rollback=True, prefetch=False))
    try:
        assert result.status.value == "rolled_back", result.to_json()
        assert result.up is not None and result.up.record.spec["command"] == broken.command
        assert record_loads == Counter({("swap", "old"): 1, ("swap", "new"): 1}), record_loads
    finally:
        with Host.open() as host:
            assert host.down("old").ok


def test_up_clear_first_runs_clear_on_the_same_context_inside_its_lock(units_host, hold, counted):
    h = hold("--memory", "2GiB", "--gpus", "0")
    old, _ = specs()
    with Host.open() as host, host.locked("a caller's own critical section"):
        r = host.up(old, UpOptions(clear_first=True))
        assert r.ok and r.cleared is not None and r.cleared.ok, r.to_json()
        assert h.pid in [t.ident.pid for t in r.cleared.plan.targets]
        assert r.timings["lock_wait_s"] == 0 and host.lock_depth == 1
    assert counted["lock"] == 1 and counted["backend"] == 1
    with Host.open() as host:
        assert host.down("old").ok
