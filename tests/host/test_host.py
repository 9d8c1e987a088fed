"""The host context: the lock taken once and re-entrant, input checked before the host is opened.

The lock is checked from outside, as another command sees it: a real ``gpuslate clear``
started while the context holds the lock (at any depth) must find it held.
"""

from __future__ import annotations

import itertools
import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslate import ClearOptions, DownOptions, Host, Selection, UpOptions, WaitOptions
from gpuslate.errors import UsageError
from gpuslate.units.swap import SwapOptions
from helpers import run_cli

LOCK_HELD = 4  # exits.py: the host lock still held when --timeout ran out


def clear_from_outside(sim_root: str, timeout: float) -> tuple[int, dict]:
    r = run_cli("--sim", sim_root, "clear", "--gpus", "0", "--timeout", str(timeout), "--json", "--yes")
    return r.returncode, json.loads(r.stdout) if r.stdout.strip() else {"stderr": r.stderr}


def finds_it_held(sim_root: str) -> bool:
    """A clear from outside waits for the lock and gives up (0.3 s: the lock is held, so it cannot
    be quicker to succeed, however slow the machine)."""
    code, doc = clear_from_outside(sim_root, 0.3)
    assert code == LOCK_HELD and "host lock" in json.dumps(doc), doc
    return True


def finds_it_free(sim_root: str) -> bool:
    """A clear from outside takes the lock and finds the GPU clean (its --timeout, the time to plan
    included, long enough for a loaded machine)."""
    code, doc = clear_from_outside(sim_root, 60)
    assert code == 0 and doc["status"] == "clean", doc
    return True


def test_lock_is_taken_once_and_reentrant(sim_host, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUSLATE_LOCK_DIR", str(tmp_path / "locks"))
    root = str(sim_host.root)
    with Host.open(root) as host:
        assert host.lock_depth == 0
        with host.locked("outer") as waited:
            assert host.lock_depth == 1 and waited >= 0
            with host.locked("inner", timeout=0) as again:  # would fail at once if it tried to take it again
                assert host.lock_depth == 2 and again == 0.0
                assert finds_it_held(root)
            assert host.lock_depth == 1
            assert finds_it_held(root)  # the inner block's end did not release it
        assert host.lock_depth == 0
        assert finds_it_free(root)
        with host.locked("again"):  # and the context can take it anew
            assert host.lock_depth == 1


def test_lock_depth_unwinds_on_error(sim_host, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUSLATE_LOCK_DIR", str(tmp_path / "locks"))
    host = Host.open(str(sim_host.root))
    with pytest.raises(RuntimeError):
        with host.locked("outer"), host.locked("inner"):
            raise RuntimeError("boom")
    assert host.lock_depth == 0
    assert finds_it_free(str(sim_host.root))


@pytest.mark.parametrize("call", [
    lambda h: h.clear(Selection(user="no-such-user-gpuslate")),
    lambda h: h.clear(Selection(match="(")),
    lambda h: h.clear(Selection(pids=(0,))),
    lambda h: h.clear(Selection(), ClearOptions(grace=-1)),
    lambda h: h.clear(Selection(), ClearOptions(timeout=math.nan)),
    lambda h: h.wait(None, WaitOptions(timeout=-1)),
    lambda h: h.down("u", DownOptions(grace=-0.5)),
    lambda h: h.up(__import__("gpuslate").UnitSpec("u", command=["true"]), UpOptions(max_used=-1)),
    lambda h: h.swap("a", "b", SwapOptions(prefetch_timeout=-1)),
], ids=["user", "match", "pid", "grace", "timeout", "wait", "down", "up", "swap"])
def test_bad_input_fails_before_the_host_is_opened(tmp_path, call):
    host = Host.open(str(tmp_path / "no-simulated-host-here"))  # opening it would fail: BackendUnavailable
    with pytest.raises(UsageError):
        call(host)
    assert host._backend is None and host.lock_depth == 0


times = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-10, 10)


@given(grace=times, timeout=times, max_used=st.none() | st.integers(-5, 5))
def test_clear_options_accept_exactly_the_usable_values(grace, timeout, max_used):
    opts = ClearOptions(grace=grace, timeout=timeout, max_used=max_used)
    usable = grace >= 0 and timeout >= 0 and (max_used is None or max_used >= 0)  # NaN is not usable
    if usable:
        assert opts.validate() is opts
    else:
        with pytest.raises(UsageError):
            opts.validate()


def test_public_names_are_exported_and_resolve():
    import gpuslate

    assert set(gpuslate._EXPORTS) <= set(gpuslate.__all__)
    for name in gpuslate.__all__:
        assert getattr(gpuslate, name) is not None, name


def test_status_through_the_host_loads_no_verb_module(sim_host):
    """``gpuslate status`` opens a Host; the modules of clear, wait and the units stay unloaded."""
    import subprocess
    import sys

    from helpers import gpuslate_env

    code = ("import sys; from gpuslate.cli.main import main; rc = main(['--sim', sys.argv[1], 'status', '--json']); "
            "print(sorted(m for m in sys.modules if m.startswith(('gpuslate.clearing', 'gpuslate.units', "
            "'dataclasses'))), file=sys.stderr); sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code, str(sim_host.root)], capture_output=True, text=True,
                       env=gpuslate_env(), timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["schema"] == "gpuslate.status.v1"
    assert r.stderr.strip().splitlines()[-1] == "[]", r.stderr


def test_waits_are_told_to_the_progress_sink_and_nothing_is_made_without_one(sim_host, hold, tmp_path, monkeypatch):
    """A wait under way goes to on_progress (what, how long, the news), a few times a second, ending
    with done; the library prints nothing. Without a sink, no news is made."""
    from gpuslate.host import session

    monkeypatch.setenv("GPUSLATE_LOCK_DIR", str(tmp_path / "locks"))
    h = hold("--gpus", "1", "--memory", "2GiB")
    seen: list[session.Progress] = []
    with Host.open(on_progress=seen.append) as host:
        assert not host.wait([1], WaitOptions(timeout=1.2)).ok
    assert 3 <= len(seen) <= 1.2 / session.PROGRESS_INTERVAL_S + 2
    assert {p.task for p in seen} == {"waiting for GPU 1 to be free"} and {p.limit_s for p in seen} == {1.2}
    assert [p.done for p in seen] == [False] * (len(seen) - 1) + [True]
    assert all(a.elapsed_s < b.elapsed_s for a, b in itertools.pairwise(seen))
    assert seen[0].detail == "GPU 1 (1 process) 2.0 GiB still used"
    seen.clear()
    with Host.open(on_progress=seen.append) as host:
        assert host.clear(Selection(gpus=(1,)), ClearOptions(grace=5)).ok
    assert all(p.task == "waiting for the GPU memory to be released" for p in seen)  # a short wait: maybe none
    made: list[str] = []
    monkeypatch.setattr("gpuslate.clearing.wait.still_held", lambda *a: made.append("news") or "")
    h = hold("--gpus", "1", "--memory", "2GiB")
    with Host.open() as host:
        assert not host.wait([1], WaitOptions(timeout=0.5)).ok
    assert made == [] and h.pid
