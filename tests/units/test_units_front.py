"""A unit's front, with a real proxy (Caddy, from the front extra) and real servers: swaps and
restarts behind it lose no request; without it, every swap fails requests; a drain that times
out, a NEW that fails (with and without --rollback), gpuslate killed in each phase and the
front's own process dying each end as docs/units.md ("Front") says."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from frontkit import StreamLoad, summary
from gpuslate.api import Host
from gpuslate.errors import UsageError
from gpuslate.front.caddy import find_caddy
from gpuslate.gpu.simhost.host import SimHost
from gpuslate.units.front import Front, front_store
from gpuslate.units.unit import load_units
from helpers import gpuslate_env, kill_leftovers, unavailable, unit_records, wait_for
from unitkit import free_port, run_units, serve_cmd

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _caddy() -> None:
    try:
        find_caddy()
    except UsageError as exc:
        unavailable(f"the front tests need Caddy (the front extra): {exc}")


@pytest.fixture
def fronts_host(units_host: SimHost) -> Iterator[SimHost]:
    """The units' host; every front process the test started is killed too, also on failure."""
    yield units_host
    with Host.open() as host:
        kill_leftovers(units_host, load_units(front_store(host)))


def up(name: str, port: int, front: int | None, *extra: str, startup: float = 0.3) -> None:
    args = ["up", name, "--gpus", "0", "--port", str(port), "--engine", "sglang", "--grace", "2"]
    if front is not None:
        args += ["--front", str(front)]
    r = run_units(*args, "--", *serve_cmd(port, *extra, startup=startup, memory="1GiB"))
    assert r.returncode == 0, r.stderr


def unit_file(**units: list[str]) -> None:
    """gpuslate.toml in the test's folder (its working folder): each unit on GPU 0, its command given."""
    lines = []
    for name, command in units.items():
        port = command[command.index("--port") + 1]
        lines += [f"[units.{name}]", f"command = {json.dumps(command)}", 'gpus = "0"', f"port = {port}",
                  'engine = "sglang"', "grace = 2", ""]
    Path("gpuslate.toml").write_text("\n".join(lines))


def front_of(name: str) -> Front:
    with Host.open() as host:
        f = Front.of_unit(host, name)
    assert f is not None
    return f


def swap_json(*args: str, timeout: float = 120) -> tuple[int, dict]:
    r = run_units(*args, "--json", timeout=timeout)
    return r.returncode, json.loads(r.stdout)


def test_restarts_and_swaps_behind_a_front_lose_nothing(fronts_host: SimHost) -> None:
    port, fport = free_port(), free_port()
    unit_file(b=serve_cmd(port, "--mode", "speculative", startup=0.3, memory="1GiB"))
    up("a", port, fport)
    with StreamLoad(f"http://127.0.0.1:{fport}", concurrency=8, max_tokens=24) as load:
        load.wait_done(16)
        reports = []
        for verb in (["restart", "a"], ["swap", "a", "b"], ["swap", "b", "a"]):
            rc, doc = swap_json(*verb)
            assert rc == 0, doc
            fr = doc["front"]
            assert fr["state"] == "serving" and fr["unit"] == verb[-1], fr
            reports.append(fr)
            load.wait_done(16)
        records = load.stop()
    failed = [r for r in records if not r.ok]
    assert not failed, summary(records)
    # each swap held requests (the load never stops), drained what was in flight on the old unit
    assert all(fr["hold"]["held"] > 0 and fr["drain"]["in_flight"] >= 0 and fr["drain"]["cut"] == 0
               for fr in reports), reports
    # a request waited at most the hold (drain + stop + start + route) plus the retry interval and its own time
    longest = max(fr["hold"]["seconds"] for fr in reports)
    assert max(r.latency for r in records) < longest + 2.0


def emulated_cmd(engine: str, port: int, *extra: str, startup: float = 0.3) -> list[str]:
    """``sim serve --emulate ENGINE``: the engine's own arguments, serving sim-model on ``port``."""
    head = {"vllm": ["serve", "sim-model", "--served-model-name", "sim-model"],
            "sglang": ["--model-path", "sim-model"], "trtllm": ["sim-model", "--host", "127.0.0.1"]}[engine]
    return [sys.executable, "-m", "gpuslate", "sim", "serve", "--startup-seconds", str(startup), "--memory", "1GiB",
            *extra, "--emulate", engine, "--", *head, "--port", str(port)]


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_swaps_behind_a_front_lose_nothing_with_each_engines_own_start_and_stop(
        fronts_host: SimHost, engine: str) -> None:
    """Each engine as it starts and stops (vLLM refuses connections while it loads, SGLang binds
    only once loaded and warms up, TensorRT-LLM closes its port at SIGTERM; a worker that dies ends
    the server): restarts and swaps behind the front still lose nothing."""
    port, fport = free_port(), free_port()
    lines = [f"[units.{name}]\ncommand = {json.dumps(emulated_cmd(engine, port, *extra))}\ngpus = \"0\"\n"
             f"port = {port}\nengine = \"{engine}\"\ngrace = 2\nfront = {fport}\n"
             for name, extra in (("a", ()), ("b", ("--base-step-ms", "5")))]
    Path("gpuslate.toml").write_text("\n".join(lines))
    r = run_units("up", "a", timeout=120)
    assert r.returncode == 0, r.stderr
    with StreamLoad(f"http://127.0.0.1:{fport}", concurrency=8, max_tokens=24) as load:
        load.wait_done(16)
        for verb in (["restart", "a"], ["swap", "a", "b"], ["swap", "b", "a"]):
            rc, doc = swap_json(*verb)
            assert rc == 0, doc
            fr = doc["front"]
            assert fr["state"] == "serving" and fr["unit"] == verb[-1] and fr["drain"]["cut"] == 0, fr
            load.wait_done(16)
        records = load.stop()
    assert all(r.ok for r in records), summary(records)
    assert run_units("down", "a").returncode == 0


def test_without_the_front_every_restart_fails_requests(fronts_host: SimHost) -> None:
    port = free_port()
    up("a", port, None)
    windows = []
    with StreamLoad(f"http://127.0.0.1:{port}", concurrency=8, max_tokens=24) as load:
        load.wait_done(16)
        for _ in range(2):
            t0 = time.monotonic()
            rc, doc = swap_json("restart", "a")
            assert rc == 0 and doc["front"] is None, doc
            windows.append((t0, time.monotonic()))
            load.wait_done(16)
        records = load.stop()
    for t0, t1 in windows:  # the same client, the same restarts: requests fail at each one
        assert any(not r.ok and t0 <= r.end <= t1 + 1 for r in records), (windows, summary(records))


def test_a_drain_that_times_out_cuts_what_runs_and_counts_it(fronts_host: SimHost) -> None:
    port, fport = free_port(), free_port()
    up("a", port, fport, "--base-step-ms", "40")  # 25 tokens a second: a long answer takes seconds
    with StreamLoad(f"http://127.0.0.1:{fport}", concurrency=2, max_tokens=2000) as slow:
        wait_for(lambda: any(r.first for r in slow.records), timeout=20)
        rc, doc = swap_json("restart", "a", "--drain-timeout", "0.5")
        records = slow.stop()
    assert rc == 0, doc
    drain = doc["front"]["drain"]
    assert drain["in_flight"] == 2 and drain["cut"] == 2 and drain["drained"] == 0, drain
    assert 0.5 <= drain["seconds"] < 3, drain
    cut = [r for r in records if not r.ok]
    assert len(cut) == 2, summary(records)  # the two long streams, cut when the unit stopped: counted above
    if importlib.util.find_spec("prometheus_client"):  # and the exporter counts them
        assert _one(_front_figures(), "gpuslate_front_last_swap_cut_requests") == 2


@pytest.mark.parametrize("rollback", [False, True])
def test_a_new_unit_that_fails(fronts_host: SimHost, rollback: bool) -> None:
    port, fport = free_port(), free_port()
    unit_file(bad=serve_cmd(port, "--fail-startup", startup=0.4, memory="1GiB"))
    up("a", port, fport)
    with StreamLoad(f"http://127.0.0.1:{fport}", concurrency=4, max_tokens=8) as load:
        load.wait_done(8)
        rc, doc = swap_json("swap", "a", "bad", *(["--rollback"] if rollback else []))
        if rollback:
            load.wait_done(8)
        records = load.stop()
    fr = doc["front"]
    if rollback:
        assert rc == 6 and doc["status"] == "rolled_back", doc
        assert fr["state"] == "serving" and fr["unit"] == "a", fr
        assert all(r.ok for r in records), summary(records)  # held through the failure, served by a again
    else:
        assert rc == 6 and doc["status"] == "up_failed", doc
        assert fr["state"] == "refusing" and "bad did not start" in fr["note"], fr
        failed = [r for r in records if not r.ok]
        assert failed and all("503" in (r.error or "") for r in failed), summary(records)
        ps = run_units("ps")
        assert "answers 503" in ps.stdout + ps.stderr, ps
        # and the next up of the unit it waits for makes it serve
        up_again = run_units("up", "a")
        assert up_again.returncode == 0, up_again.stderr
        assert front_of("a").live()[0].value == "serving"


def _kill_swap_at(phase: str, port: int, fport: int) -> subprocess.Popen[str]:
    """A swap a -> b, SIGKILLed once it is in ``phase``."""
    proc = subprocess.Popen([sys.executable, "-m", "gpuslate", "swap", "a", "b", "--drain-timeout", "30"],
                            env=gpuslate_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        if phase == "draining":
            wait_for(lambda: front_of("a").live()[0].value == "holding", timeout=30)  # the route closed
        elif phase == "stopping":
            wait_for(lambda: "SIGTERM" in _audit(), timeout=30)
        else:  # starting: b's record says it is starting
            wait_for(lambda: (r := unit_records().load("b")) is not None and r.phase == "starting", timeout=30)
    finally:
        proc.kill()
        proc.wait(10)
    return proc


def _audit() -> str:
    return run_units("audit", "--json").stdout


@pytest.mark.parametrize("phase", ["draining", "stopping", "starting"])
def test_gpuslate_killed_in_each_phase_leaves_a_named_front_that_a_command_routes(
        fronts_host: SimHost, phase: str) -> None:
    port, fport = free_port(), free_port()
    unit_file(b=serve_cmd(port, startup=3.0, memory="1GiB"))  # slow to start: killed while it does
    up("a", port, fport, "--base-step-ms", "40")
    with StreamLoad(f"http://127.0.0.1:{fport}", concurrency=2, max_tokens=60) as load:
        wait_for(lambda: any(r.first for r in load.records), timeout=20)
        _kill_swap_at(phase, port, fport)
        ps = run_units("ps")
        assert "the gpuslate that held it is gone" in ps.stdout + ps.stderr, ps.stdout + ps.stderr
        f = front_of("a")
        assert f.live()[0].value == "stranded"
        # the remedy ps names: the unit that is left runs again behind it
        runs = {u.name for u in load_units(unit_records()) if u.running()}
        remedy = ("restart", "a") if "a" in runs else ("restart", "b") if "b" in runs else ("up", "b")
        if remedy[0] == "up":  # a's server took its SIGTERM and is going: its workers go with it, then
            # their memory is released; up's pre-flight wants the GPU free, as it should
            free = run_units("wait", "--free", "--gpus", "0", "--timeout", "30")
            assert free.returncode == 0, free.stdout + free.stderr
        rr = run_units(*remedy, timeout=120)
        assert rr.returncode == 0, rr.stderr
        load.wait_done(4, timeout=60)
        records = load.stop()
    assert front_of(remedy[1]).live()[0].value == "serving"
    # the requests held across the crash were served once it was routed (only those in flight on
    # a when it was stopped, in the stopping phase, were cut)
    held_after = [r for r in records if r.start > records[0].start + 0.1 and r.first is not None]
    assert held_after, summary(records)


def test_the_front_process_dying_is_named_and_a_restart_brings_it_back(fronts_host: SimHost) -> None:
    port, fport = free_port(), free_port()
    up("a", port, fport)
    f = front_of("a")
    assert f.procs is not None and f.procs.record is not None
    os.kill(f.procs.record.pid, signal.SIGKILL)
    wait_for(lambda: front_of("a").live()[0].value == "down", timeout=10)
    ps = run_units("ps")
    assert "its process is gone" in ps.stdout + ps.stderr
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", fport), timeout=1).close()
    rc, doc = swap_json("restart", "a")
    assert rc == 0 and doc["front"]["state"] == "serving" and doc["front"]["started"], doc
    with StreamLoad(f"http://127.0.0.1:{fport}", concurrency=2, max_tokens=4) as load:
        load.wait_done(4)
        assert all(r.ok for r in load.stop())


def test_down_ends_the_front_and_the_defaults_are_safe(fronts_host: SimHost) -> None:
    port, fport = free_port(), free_port()
    up("a", port, fport)
    f = front_of("a")
    # 127.0.0.1 only; the admin and route sockets are the owner's alone
    assert f.record.host == "127.0.0.1"
    for sock in (f.paths.admin, f.paths.route_admin, f.paths.route):
        st = os.stat(sock)
        assert stat.S_ISSOCK(st.st_mode) and st.st_mode & 0o077 == 0, (sock, oct(st.st_mode))
    # no open proxy: an absolute URI or another Host header still reaches the unit, nothing else
    with socket.create_connection(("127.0.0.1", fport), timeout=5) as s:
        s.sendall(b"GET http://example.invalid:1/v1/models HTTP/1.1\r\nHost: example.invalid:1\r\n"
                  b"Connection: close\r\n\r\n")
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    assert b"sim-model" in answer, answer[:300]
    pids = [st.pid for st in f.procs.members()] if f.procs else []
    assert len(pids) == 2  # the front and its route
    d = run_units("down", "a", "--json")
    assert d.returncode == 0, d.stderr
    assert json.loads(d.stdout)["front"]["state"] == "stopped"
    assert all(not Path(f"/proc/{p}").exists() or "zombie" in Path(f"/proc/{p}/status").read_text().lower()
               for p in pids)
    assert "front-" in _audit()  # its signals were audited like a unit's


def _up_json(name: str) -> tuple[int, dict]:
    r = run_units("up", name, "--json", timeout=120)
    return r.returncode, json.loads(r.stdout) if r.stdout.strip() else {"stderr": r.stderr}


def test_up_of_a_running_unit_routes_its_stranded_front(fronts_host: SimHost) -> None:
    """A swap killed while it drains leaves the front holding for nobody (stranded) and OLD running:
    ``up OLD`` routes the front to it again, says so, and the requests it held go through."""
    port, fport = free_port(), free_port()
    unit_file(b=serve_cmd(port, startup=3.0, memory="1GiB"))
    up("a", port, fport, "--base-step-ms", "40")
    with StreamLoad(f"http://127.0.0.1:{fport}", concurrency=2, max_tokens=60) as load:
        wait_for(lambda: any(r.first for r in load.records), timeout=20)
        _kill_swap_at("draining", port, fport)
        assert front_of("a").live()[0].value == "stranded"
        rc, doc = _up_json("a")
        assert rc == 0 and doc["status"] == "ready", doc
        fr = doc["front"]
        assert fr["state"] == "serving" and fr["unit"] == "a" and not fr["started"], fr
        assert "it was stranded" in fr["note"] and "routed to a" in fr["note"], fr
        load.wait_done(4, timeout=60)
        records = load.stop()
    assert front_of("a").live()[0].value == "serving"
    # the requests held while it was stranded were served once it was routed
    assert not [r for r in records if r.error], summary(records)
    plain = run_units("up", "a")  # and it says so: routed, no second server started
    assert plain.returncode == 2 and "already running" in plain.stderr, plain


@pytest.mark.parametrize("gone", ["route", "front"])
def test_up_of_a_running_unit_starts_its_front_again_when_a_process_of_it_is_gone(
        fronts_host: SimHost, gone: str) -> None:
    port, fport = free_port(), free_port()
    up("a", port, fport)
    f = front_of("a")
    assert f.procs is not None and f.procs.record is not None
    main = f.procs.record.pid
    pids = [st.pid for st in f.procs.members()]
    victim = main if gone == "front" else next(p for p in pids if p != main)
    os.kill(victim, signal.SIGKILL)
    want = "down" if gone == "front" else "no_route"
    wait_for(lambda: front_of("a").live()[0].value == want, timeout=10)
    ps = run_units("ps")
    assert "'gpuslate up a' starts it again and routes it" in ps.stdout + ps.stderr, ps
    r = run_units("up", "a", timeout=120)
    assert r.returncode == 0, r.stderr
    assert "was gone: started again and routed to a" in r.stdout, r.stdout
    assert front_of("a").live()[0].value == "serving"
    with StreamLoad(f"http://127.0.0.1:{fport}", concurrency=2, max_tokens=4) as load:
        load.wait_done(4)
        assert all(r.ok for r in load.stop())


def test_up_routes_nothing_to_a_unit_that_does_not_answer(fronts_host: SimHost) -> None:
    port, fport = free_port(), free_port()
    unit_file(b=serve_cmd(port, startup=3.0, memory="1GiB"))
    up("a", port, fport, "--base-step-ms", "40")
    with StreamLoad(f"http://127.0.0.1:{fport}", concurrency=1, max_tokens=60) as load:
        wait_for(lambda: any(r.first for r in load.records), timeout=20)
        _kill_swap_at("draining", port, fport)
        load.stop()
    unit = next(u for u in load_units(unit_records()) if u.name == "a")
    assert unit.record is not None
    os.kill(unit.record.pid, signal.SIGSTOP)  # it runs, and answers nothing
    try:
        r = run_units("up", "a", timeout=120)
        assert r.returncode == 2 and "does not answer its readiness check" in r.stderr, r
        assert front_of("a").live()[0].value == "stranded"  # nothing changed
    finally:
        os.kill(unit.record.pid, signal.SIGCONT)
    assert run_units("up", "a", timeout=120).returncode == 0
    assert front_of("a").live()[0].value == "serving"


def _front_figures() -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """One scrape of the exporter's collector (as ``gpuslate exporter`` serves it): the front's figures."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from gpuslate.exporter.collector import registry_for

    with Host.open() as host:
        text = generate_latest(registry_for(host, audit=False)).decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith("gpuslate_front_"):
                out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def _one(figures: dict, name: str) -> float | None:
    values = list(figures.get(name, {}).values())
    return values[0] if values else None


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_the_exporters_front_figures_follow_a_swap_with_each_engine(fronts_host: SimHost, engine: str) -> None:
    """While NEW loads (vLLM refusing, SGLang not yet bound then warming up, TensorRT-LLM refusing)
    the front holds every request, and the exporter counts them; after the swap it shows what the
    swap held, the longest hold, no cut, and the front serving NEW."""
    pytest.importorskip("prometheus_client")
    port, fport = free_port(), free_port()
    lines = [f"[units.{name}]\ncommand = {json.dumps(emulated_cmd(engine, port, startup=startup))}\ngpus = \"0\"\n"
             f"port = {port}\nengine = \"{engine}\"\ngrace = 2\nfront = {fport}\n"
             for name, startup in (("a", 0.3), ("b", 2.0))]
    Path("gpuslate.toml").write_text("\n".join(lines))
    assert run_units("up", "a", timeout=120).returncode == 0
    figures = _front_figures()
    assert figures["gpuslate_front_serving"] == {(("front", f"127.0.0.1:{fport}"), ("unit", "a")): 1.0}
    assert _one(figures, "gpuslate_front_held_requests") == 0
    swap = subprocess.Popen([sys.executable, "-m", "gpuslate", "swap", "a", "b", "--json"], env=gpuslate_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for(lambda: (r := unit_records().load("b")) is not None and r.phase == "starting", timeout=60)
        with StreamLoad(f"http://127.0.0.1:{fport}", concurrency=3, max_tokens=8) as load:
            # b loads: all three are held, and the exporter says so
            wait_for(lambda: _one(_front_figures(), "gpuslate_front_held_requests") == 3, timeout=30)
            assert _one(_front_figures(), "gpuslate_front_serving") == 0
            out, err = swap.communicate(timeout=120)
            load.wait_done(3)
            records = load.stop()
    finally:
        if swap.poll() is None:
            swap.kill()
            swap.wait()
    assert swap.returncode == 0, err
    hold = json.loads(out)["front"]["hold"]
    figures = _front_figures()
    assert figures["gpuslate_front_serving"] == {(("front", f"127.0.0.1:{fport}"), ("unit", "b")): 1.0}
    assert _one(figures, "gpuslate_front_held_requests") == 0
    assert _one(figures, "gpuslate_front_last_swap_held_requests") == hold["held"] >= 3
    longest = _one(figures, "gpuslate_front_last_swap_longest_hold_seconds")
    assert longest == hold["longest_hold_s"] and 0 < longest <= hold["seconds"] + hold["resolution_s"]
    assert _one(figures, "gpuslate_front_last_swap_cut_requests") == 0
    assert all(r.ok for r in records), summary(records)
    assert run_units("down", "b").returncode == 0
