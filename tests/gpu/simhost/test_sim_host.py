"""The simulated host tells the truth like a driver: host pids from the processes
that hold the memory (never what a holder says), other users' records never break
a reader, and no GPU ever holds more than its memory (an out-of-memory error).

Every holder here is a real process, started by the test in its own session and
killed by it; the second user is created and removed by the module.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuslate.gpu.simhost.host import SimHost
from gpuslate.proc.procfs import read_stat
from helpers import SRC, GiB, gpuslate_env, is_gone, per_worker, throwaway_user, wait_for

USER = per_worker("gpuslate-simhost")
SYSTEM_PYTHON = "/usr/bin/python3"
CI = os.environ.get("CI") == "true"


def gpuslate(*args: str, sim: SimHost, timeout: float = 60, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuslate", "--sim", str(sim.root), *args], text=True,
                          capture_output=True, env=gpuslate_env(), timeout=timeout, **kw)


def status(sim: SimHost) -> dict:
    r = gpuslate("status", "--json", sim=sim)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    return json.loads(r.stdout)


def holders(doc: dict, gpu: int) -> dict[int, int | None]:
    """pid -> memory of the processes the driver lists with a context on ``gpu``."""
    return {p["pid"]: p["used_memory"] for p in doc["gpus"][gpu]["processes"] if p["kind"] != "handle"}


def kill_tree(p: subprocess.Popen[str]) -> None:
    """SIGKILL the session the test started (a namespace's init included)."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait(10)


def start(argv: list[str], **kw) -> subprocess.Popen[str]:
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=kw.pop("env", gpuslate_env()), start_new_session=True, **kw)


def ready_line(p: subprocess.Popen[str]) -> dict:
    line = p.stdout.readline()
    if not line:
        raise AssertionError(f"no ready line (exit {p.wait(10)}): {p.stderr.read()}")
    return json.loads(line)


@pytest.fixture
def host(tmp_path: Path) -> SimHost:
    return SimHost.init(tmp_path / "host", gpus=2, memory=int(95.6 * GiB), release_delay=0.2)


# -- J1: host pids, from the holder of the memory ---------------------------------------------

def _namespaced(host: SimHost, *hold_args: str, own_proc: bool = True) -> tuple[subprocess.Popen[str], dict]:
    if not shutil.which("unshare"):
        pytest.fail("unshare (util-linux) is needed") if CI else pytest.skip("no unshare")
    p = start(["unshare", "--pid", "--fork", *(["--mount-proc"] if own_proc else []), sys.executable, "-m",
               "gpuslate", "--sim", str(host.root), "sim", "hold", *hold_args])
    line = p.stdout.readline()
    if not line:
        err = p.stderr.read()
        p.wait(10)
        if "Operation not permitted" in err and not CI:
            pytest.skip(f"cannot make a PID namespace here: {err.strip()}")
        raise AssertionError(f"namespaced holder failed: {err}")
    return p, json.loads(line)


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(x) for x in f.read().split()]


@pytest.mark.parametrize("own_proc", [True, False], ids=["mount-proc", "host-proc"])
def test_namespaced_holder_is_reported_by_its_host_pid_and_clear_finds_it(host, own_proc):
    """Its own /proc or the host's: it believes it is PID 1 either way, and is reported by its host pid."""
    p, ready = _namespaced(host, "--gpus", "0", "--memory", "4GiB", own_proc=own_proc)
    try:
        (host_pid,) = _children(p.pid)  # unshare's child: the namespace's init, as the host sees it
        assert ready["pid"] == (1 if own_proc else host_pid)  # what its /proc says
        doc = status(host)
        assert holders(doc, 0) == {host_pid: 4 * GiB}
        assert 1 not in holders(doc, 0) and doc["gpus"][0]["memory"]["used"] == 4 * GiB
        plan = gpuslate("clear", "--pid", str(host_pid), "--dry-run", "--json", sim=host)
        assert plan.returncode == 0, plan.stderr
        assert host_pid in [t["pid"] for t in json.loads(plan.stdout)["targets"]]
        assert not is_gone(host_pid)
        act = gpuslate("clear", "--pid", str(host_pid), "--yes", "--grace", "0.5", "--json", sim=host)
        assert act.returncode == 0, (act.stdout, act.stderr)
        assert json.loads(act.stdout)["status"] == "clean"
        assert is_gone(host_pid)
        assert status(host)["gpus"][0]["memory"]["used"] == 0
    finally:
        kill_tree(p)


@pytest.mark.parametrize("own_proc", [True, False], ids=["mount-proc", "host-proc"])
def test_namespaced_workers_are_reported_by_their_host_pids(host, own_proc):
    p, ready = _namespaced(host, "--gpus", "0,1", "--memory", "2GiB", "--workers", "2", own_proc=own_proc)
    try:
        (launcher,) = _children(p.pid)
        workers = _children(launcher)
        assert ready["pid"] == (1 if own_proc else launcher)
        assert sorted(ready["workers"]) == ([2, 3] if own_proc else sorted(workers))
        doc = status(host)
        listed = {pid for g in (0, 1) for pid in holders(doc, g)}
        assert listed == set(workers) and len(workers) == 2
    finally:
        kill_tree(p)


LIAR = textwrap.dedent("""
    import os, sys, time
    from gpuslate.gpu.simhost.host import SimHost
    from gpuslate.gpu.simhost.records import Claim, create_record
    host = SimHost(sys.argv[1])
    claim = Claim(0, 1, 0, 3 << 30, "compute")  # says: PID 1 holds 3 GiB
    if sys.argv[2] == "device":
        dev = os.open(host.device_path(0), os.O_RDONLY)
    fd = create_record(host.alloc_dir(), "g0.liar.json", claim)
    print("ready", flush=True)
    time.sleep(600)
""")


@pytest.mark.parametrize("holds_device", [True, False])
def test_a_records_claimed_pid_is_never_reported(host, holds_device):
    """The owner is whoever holds the record and the device file, whatever the record says;
    a record held without the device file counts its memory but names no process."""
    p = start([sys.executable, "-c", LIAR, str(host.root), "device" if holds_device else "none"])
    try:
        assert p.stdout.readline() == "ready\n"
        doc = status(host)
        assert doc["gpus"][0]["memory"]["used"] == 3 << 30  # held: its holder lives
        assert holders(doc, 0) == ({p.pid: 3 << 30} if holds_device else {})
        kill_tree(p)
        # released like any dead holder's; its claimed pid (1, alive) is never named meanwhile
        doc = status(host)
        assert 1 not in holders(doc, 0)
        wait_for(lambda: status(host)["gpus"][0]["memory"]["used"] == 0)
    finally:
        kill_tree(p)


FORKER = textwrap.dedent("""
    import os, sys, time
    from gpuslate.proc.procfs import identity
    from gpuslate.gpu.simhost.host import SimHost
    host = SimHost(sys.argv[1])
    dev = os.open(host.device_path(0), os.O_RDONLY)
    host.add_record(0, identity(os.getpid()), 2 << 30)
    child = os.fork()
    if child == 0:
        time.sleep(600)
        os._exit(0)
    print(child, flush=True)
    if sys.argv[2] == "exit":
        os._exit(0)  # the child keeps the context open: it holds the memory now
    time.sleep(600)
""")


@pytest.mark.parametrize("parent", ["stays", "exit"])
def test_a_context_inherited_by_fork_is_named_once(host, parent):
    p = start([sys.executable, "-c", FORKER, str(host.root), parent])
    try:
        child = int(p.stdout.readline())
        if parent == "exit":
            p.wait(10)
        doc = status(host)
        assert holders(doc, 0) == {(p.pid if parent == "stays" else child): 2 << 30}  # the creator while it lives
        assert doc["gpus"][0]["memory"]["used"] == 2 << 30
    finally:
        kill_tree(p)


def test_a_hard_link_to_a_record_is_the_same_memory(host):
    p = start([sys.executable, "-m", "gpuslate", "--sim", str(host.root), "sim", "hold", "--gpus", "0",
               "--memory", "5GiB"])
    try:
        pid = ready_line(p)["pid"]
        (record,) = host.alloc.glob("g0.*.json")
        os.link(record, host.alloc / "g0.copy.json")
        os.link(record, host.alloc / "g1.copy.json")
        doc = status(host)
        assert holders(doc, 0) == {pid: 5 * GiB} and doc["gpus"][0]["memory"]["used"] == 5 * GiB
        assert doc["gpus"][1]["memory"]["used"] == 0
    finally:
        kill_tree(p)


def test_an_unlocked_record_is_released_not_believed(host):
    """A record written by hand (no holder keeps it) is a dead holder's: released after the delay."""
    (host.alloc / "g1.forged.json").write_text(json.dumps(
        {"gpu": 1, "pid": 1, "start_ticks": 0, "bytes": 7 << 30, "kind": "compute"}))
    doc = status(host)
    assert holders(doc, 1) == {}
    wait_for(lambda: status(host)["gpus"][1]["memory"]["used"] == 0)
    assert not (host.alloc / "g1.forged.json").exists()


@pytest.mark.parametrize("content,problem", [
    (b"{not json", "invalid"),
    (b'{"gpu": 0, "pid": 5, "bytes": -1, "kind": "compute"}', "invalid"),
    (b"x" * 5000, "too large"),
    (b"[" * 2000 + b"]" * 2000, "invalid"),
    (None, "not a regular file"),  # a FIFO: never hangs the reader
])
def test_a_broken_record_makes_its_gpu_unknown_never_clean(host, content, problem):
    path = host.alloc / "g1.broken.json"
    if content is None:
        os.mkfifo(path)
    else:
        path.write_bytes(content)
    doc = status(host)
    gpu1 = doc["gpus"][1]
    assert gpu1["error"] and problem in gpu1["error"] and gpu1["memory"] is None
    assert doc["gpus"][0]["error"] is None and doc["gpus"][0]["memory"]["used"] == 0
    r = gpuslate("clear", "--gpus", "1", "--yes", "--timeout", "0.3", "--json", sim=host)
    assert r.returncode == 4 and json.loads(r.stdout)["status"] != "clean"  # a failed query is never clean


def test_a_broken_record_of_no_known_gpu_makes_every_gpu_unknown(host):
    (host.alloc / "g\u00b2.odd.json").write_text("{}")  # a name that only looks like a GPU's
    doc = status(host)
    assert all(g["error"] and "invalid" in g["error"] for g in doc["gpus"])


# -- J2: another user's records ---------------------------------------------------------------

@pytest.fixture(scope="module")
def other_user() -> Iterator[pwd.struct_passwd]:
    """A second user for the module; removed afterwards."""
    with throwaway_user(USER) as user:
        yield user


@pytest.fixture
def shared(other_user) -> Iterator[SimHost]:
    """A simulated host every user may hold memory on (its folders 1777, like /tmp)."""
    base = Path(tempfile.mkdtemp(prefix="gpuslate-simhost-"))
    base.chmod(0o755)
    host = SimHost.init(base / "host", gpus=2, memory=96 * GiB, release_delay=0.2)
    for d in (host.root, host.alloc):
        d.chmod(0o1777)
    state = base / "state-user"
    state.mkdir(mode=0o700)
    os.chown(state, other_user.pw_uid, -1)
    try:
        yield host
    finally:
        shutil.rmtree(base, ignore_errors=True)


def as_user(user: pwd.struct_passwd, host: SimHost, *args: str) -> list[str]:
    py = SYSTEM_PYTHON if os.access(SYSTEM_PYTHON, os.X_OK) else sys.executable
    return [py, "-m", "gpuslate", "--sim", str(host.root), *args]


def user_kw(user: pwd.struct_passwd, host: SimHost) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHOME"}
    env.update(PYTHONPATH=SRC, GPUSLATE_STATE_DIR=str(host.root.parent / "state-user"))
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": [], "env": env, "cwd": "/"}


def user_status(user: pwd.struct_passwd, host: SimHost) -> dict:
    r = subprocess.run(as_user(user, host, "status", "--json"), capture_output=True, text=True, timeout=60,
                       **user_kw(user, host))
    if r.returncode != 0 and "No module named" in r.stderr and not CI:
        pytest.skip(f"{USER} cannot run gpuslate from {SRC}")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    return json.loads(r.stdout)


def test_other_users_records_never_break_status(shared, other_user):
    """Root's holders, live and dead, as seen by another user: named by host pid (the kernel's
    lock owner: their fd tables are not readable), released after the delay, no traceback."""
    live = start([sys.executable, "-m", "gpuslate", "--sim", str(shared.root), "sim", "hold", "--gpus", "0",
                  "--memory", "5GiB"])
    dead = start([sys.executable, "-m", "gpuslate", "--sim", str(shared.root), "sim", "hold", "--gpus", "1",
                  "--memory", "6GiB"])
    try:
        live_pid, dead_pid = ready_line(live)["pid"], ready_line(dead)["pid"]
        doc = user_status(other_user, shared)
        assert holders(doc, 0) == {live_pid: 5 * GiB} and holders(doc, 1) == {dead_pid: 6 * GiB}
        kill_tree(dead)
        # the user may not remove root's record (sticky folder: EPERM): it still sees it released
        wait_for(lambda: user_status(other_user, shared)["gpus"][1]["memory"]["used"] == 0)
        assert holders(user_status(other_user, shared), 0) == {live_pid: 5 * GiB}
        # and the user's own holder beside root's
        mine = start(as_user(other_user, shared, "sim", "hold", "--gpus", "1", "--memory", "1GiB"),
                     **user_kw(other_user, shared))
        try:
            assert ready_line(mine)["pid"] == mine.pid
            doc = status(shared)  # root reads the user's record and fd table
            assert holders(doc, 1) == {mine.pid: 1 * GiB}
            assert pwd.getpwuid(os.stat(next(shared.alloc.glob("g1.*.json"))).st_uid).pw_name == USER
        finally:
            kill_tree(mine)
    finally:
        kill_tree(live)
        kill_tree(dead)


def test_an_unreadable_record_is_an_error_of_its_gpu_for_that_user(shared, other_user):
    path = shared.alloc / "g1.private.json"
    path.write_text(json.dumps({"gpu": 1, "pid": None, "start_ticks": None, "bytes": GiB, "kind": "compute"}))
    path.chmod(0o600)
    doc = user_status(other_user, shared)
    assert "cannot be read" in doc["gpus"][1]["error"] and doc["gpus"][1]["memory"] is None
    assert doc["gpus"][0]["error"] is None
    assert status(shared)["gpus"][1]["memory"]["used"] == GiB  # root reads it: a leak of 1 GiB


def test_another_users_reset_of_a_shared_host_is_one_line(shared, other_user):
    live = start([sys.executable, "-m", "gpuslate", "--sim", str(shared.root), "sim", "hold", "--gpus", "0",
                  "--memory", "5GiB"])
    try:
        pid = ready_line(live)["pid"]
        r = subprocess.run(as_user(other_user, shared, "sim", "init", str(shared.root), "--count", "2"),
                           capture_output=True, text=True, timeout=60, **user_kw(other_user, shared))
        assert r.returncode == 5 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.count("gpuslate: error:") == 1 and "cannot initialise" in r.stderr
        assert holders(status(shared), 0) == {pid: 5 * GiB}  # root's holder keeps its memory
    finally:
        kill_tree(live)


def test_a_user_who_may_not_write_the_host_gets_one_line(shared, other_user):
    shared.alloc.chmod(0o755)  # root's host, not shared for holding
    r = subprocess.run(as_user(other_user, shared, "sim", "hold", "--gpus", "0", "--memory", "1GiB"),
                       capture_output=True, text=True, timeout=60, **user_kw(other_user, shared))
    assert r.returncode == 5 and "Traceback" not in r.stderr, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert "cannot record memory" in line and "Permission denied" in line
    assert status(shared)["gpus"][0]["memory"]["used"] == 0


# -- out of memory ---------------------------------------------------------------------------

def test_hold_beyond_a_gpus_memory_fails_like_a_driver(host):
    r = gpuslate("sim", "hold", "--gpus", "0", "--memory", "200GiB", sim=host)
    assert r.returncode == 6 and r.stdout == ""
    (line,) = r.stderr.strip().splitlines()
    assert "out of memory" in line and "200.0 GiB" in line and "95.6 GiB total" in line
    assert not list(host.alloc.glob("*.json"))


def test_a_failed_multi_gpu_hold_holds_nothing(host):
    first = start([sys.executable, "-m", "gpuslate", "--sim", str(host.root), "sim", "hold", "--gpus", "1",
                   "--memory", "60GiB"])
    try:
        ready_line(first)
        r = gpuslate("sim", "hold", "--gpus", "0,1", "--memory", "40GiB", sim=host)
        assert r.returncode == 6 and "simulated GPU 1 is out of memory" in r.stderr
        assert status(host)["gpus"][0]["memory"]["used"] == 0  # GPU 0 had room: all or nothing
    finally:
        kill_tree(first)


def test_concurrent_holders_never_overcommit_a_gpu(host):
    """Six holders of 30 GiB race for one 95.6 GiB GPU: exactly three get it."""
    procs = [start([sys.executable, "-m", "gpuslate", "--sim", str(host.root), "sim", "hold", "--gpus", "0",
                    "--memory", "30GiB"]) for _ in range(6)]
    try:
        ready = [p for p in procs if p.stdout.readline()]
        failed = [p for p in procs if p not in ready]
        assert len(ready) == 3
        for p in failed:
            assert p.wait(30) == 6 and "out of memory" in p.stderr.read()
        assert status(host)["gpus"][0]["memory"]["used"] == 90 * GiB
    finally:
        for p in procs:
            kill_tree(p)


@pytest.mark.parametrize("orphan", [[], ["--orphan-workers"]], ids=["children", "orphans"])
def test_workers_that_do_not_fit_fail_and_release_the_others(host, orphan):
    """Two workers share GPU 0 (50 GiB each) beside a 40 GiB holder: the second fails, the first
    ends itself at the start barrier (even reparented away from the launcher), exit 6, and the
    memory comes back."""
    other = start([sys.executable, "-m", "gpuslate", "--sim", str(host.root), "sim", "hold", "--gpus", "0",
                   "--memory", "40GiB"])
    try:
        ready_line(other)
        r = gpuslate("sim", "hold", "--gpus", "0", "--memory", "100GiB", "--workers", "2", *orphan, sim=host)
        assert r.returncode == 6 and "simulated worker failed" in r.stderr and "out of memory" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
        wait_for(lambda: status(host)["gpus"][0]["memory"]["used"] == 40 * GiB)
    finally:
        kill_tree(other)


def test_sim_serve_whose_workers_do_not_fit_fails_startup(host):
    r = gpuslate("sim", "serve", "--port", "0", "--gpus", "0,1", "--memory", "200GiB", sim=host)
    assert r.returncode == 6, (r.stdout, r.stderr)
    assert "out of memory" in r.stderr and "Traceback" not in r.stderr
    wait_for(lambda: all(g["memory"]["used"] == 0 for g in status(host)["gpus"]))


def test_sim_serve_that_fits_holds_its_memory(host):
    p = start([sys.executable, "-m", "gpuslate", "--sim", str(host.root), "sim", "serve", "--port", "0",
               "--gpus", "0", "--memory", "90GiB", "--startup-seconds", "0"])
    try:
        wait_for(lambda: status(host)["gpus"][0]["memory"]["used"] == 90 * GiB, timeout=20)
        r = gpuslate("sim", "hold", "--gpus", "0", "--memory", "10GiB", sim=host)
        assert r.returncode == 6 and "out of memory" in r.stderr
    finally:
        kill_tree(p)


def test_leak_beyond_a_gpus_memory_fails(host):
    assert gpuslate("sim", "leak", "--gpu", "1", "--memory", "90GiB", sim=host).returncode == 0
    r = gpuslate("sim", "leak", "--gpu", "1", "--memory", "10GiB", sim=host)
    assert r.returncode == 6 and "out of memory" in r.stderr
    assert status(host)["gpus"][1]["memory"]["used"] == 90 * GiB


def test_memory_being_released_is_not_free_yet(tmp_path):
    slow = SimHost.init(tmp_path / "slow", gpus=1, memory=96 * GiB, release_delay=1.0)
    p = start([sys.executable, "-m", "gpuslate", "--sim", str(slow.root), "sim", "hold", "--gpus", "0",
               "--memory", "80GiB"])
    ready_line(p)
    kill_tree(p)
    r = gpuslate("sim", "hold", "--gpus", "0", "--memory", "80GiB", sim=slow, timeout=5, stdin=subprocess.DEVNULL)
    assert r.returncode == 6 and "80.0 GiB in use" in r.stderr  # the driver is still tearing it down


# -- sim init and --sim -------------------------------------------------------------------------

def test_sim_init_refuses_a_sim_naming_another_folder(tmp_path, host):
    r = subprocess.run([sys.executable, "-m", "gpuslate", "--sim", str(host.root), "sim", "init",
                        str(tmp_path / "other")], capture_output=True, text=True, env=gpuslate_env())
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--sim names another folder" in r.stderr
    assert not (tmp_path / "other").exists()
    same = subprocess.run([sys.executable, "-m", "gpuslate", "sim", "init", str(host.root), "--sim",
                           str(host.root), "--count", "2"], capture_output=True, text=True, env=gpuslate_env())
    assert same.returncode == 0, same.stderr


# -- a driver that hangs, on purpose ------------------------------------------------------------

def test_a_stuck_fifo_hangs_every_read_until_written(host):
    """DIR/stuck (a FIFO of the host's owner) is the one deliberate way to make the simulated
    driver hang; a record that is a FIFO never does (test_a_broken_record_...)."""
    os.mkfifo(host.root / "stuck")
    p = start([sys.executable, "-m", "gpuslate", "--sim", str(host.root), "status", "--json"])
    try:
        def reader_waits() -> int | None:
            try:
                return os.open(host.root / "stuck", os.O_WRONLY | os.O_NONBLOCK)  # ENXIO until a reader opened it
            except OSError:
                return None

        fd = wait_for(reader_waits, timeout=20)
        assert p.poll() is None  # status is blocked in the driver
        (host.root / "stuck").unlink()
        os.close(fd)  # the driver answers
        out, err = p.communicate(timeout=30)
        assert p.returncode == 0 and json.loads(out)["gpus"][0]["error"] is None, err
    finally:
        kill_tree(p)


@pytest.mark.parametrize("how", ["leader exits", "private table"])
def test_memory_held_by_a_thread_is_the_process_s(tmp_path, how):
    """A driver names the process whatever thread made the context (issue 24): memory held by a thread
    whose main thread exited, or by a thread that unshared its file table (``/proc/PID/fd`` shows
    neither), is the process's, never "held by no process"."""
    host = SimHost.init(tmp_path / "h", gpus=1, memory=8 * GiB)
    code = textwrap.dedent(f"""\
        import ctypes, os, sys, threading
        from gpuslate.gpu.simhost.host import SimHost
        host = SimHost({str(host.root)!r})
        held = threading.Event()
        def hold():
            if {how == "private table"}:
                assert ctypes.CDLL(None, use_errno=True).unshare(0x400) == 0  # CLONE_FILES
            fds = [os.open(host.device_path(0), os.O_RDONLY), *host.allocate([(0, 1 << 30)])]
            held.set()
            sys.stdin.read()
        threading.Thread(target=hold).start()
        held.wait()
        print("ready", flush=True)
        if {how == "leader exits"}:
            ctypes.CDLL(None).pthread_exit(None)
        threading.Event().wait()
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         env=gpuslate_env(), start_new_session=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        if how == "leader exits":
            wait_for(lambda: read_stat(p.pid).leader_exited)
            assert os.listdir(f"/proc/{p.pid}/fd") == []
        (held,) = host.held()
        assert held.alive and held.record.pid == p.pid and held.record.bytes == 1 << 30
    finally:
        p.kill()
        p.wait()
    wait_for(lambda: not any(h.alive for h in host.held()))
