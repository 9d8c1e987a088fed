"""Issue 15's reproductions, each with real processes on a simulated host: what ``clear``
must never do, attacked in the shapes that once got through.

A. a target's death must not end a spared process (a signal forwarder, a PID namespace's init);
B. a process group that means nothing from here (pgid 0) or that the caller shares merges nothing;
C. a parent is a victim by identity, not by pid;
D. protection comes from kernel facts (a container's PID 2, a job titled ``sshd``, shell options);
G. no success without evidence (a selection of nothing; an audit log that fills mid-run);
H. bounded work on hostile input (a 600 KB argv under ``--match``).

Several need root (a second user, PID namespaces); CI runs as root.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpuslate.clearing.clear import _ForkWatch
from gpuslate.clearing.plan import Plan, Selection
from gpuslate.errors import PermissionDenied
from gpuslate.proc.procfs import ProcessId, read_stat
from gpuslate.proc.terminate import Victim, terminate
from helpers import gpuslate_env, is_gone, wait_for
from otheruser import _env, start_as

PY = sys.executable
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (CI runs as root)")


def alive(pid: int) -> bool:
    return not is_gone(pid)


def clear(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> tuple[int, dict, str]:
    r = subprocess.run([PY, "-m", "gpuslate", "clear", "--json", "--yes", *args], capture_output=True, text=True,
                       env=gpuslate_env(env), timeout=timeout)
    try:
        doc = json.loads(r.stdout)
    except json.JSONDecodeError:
        raise AssertionError((r.returncode, r.stdout, r.stderr)) from None
    return r.returncode, doc, r.stderr


def ready_pids(path: Path, n: int, timeout: float = 20) -> list[int]:
    """The pids of ``n`` holders that wrote their ready lines into ``path``."""
    def read() -> list[int] | None:
        try:
            lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
        except FileNotFoundError:
            return None
        return [json.loads(ln)["pid"] for ln in lines] if len(lines) >= n else None
    return wait_for(read, timeout)  # type: ignore[return-value]


def hold_cmd(root: Path, gpus: str, memory: str = "2GiB", *extra: str) -> str:
    return f"{PY} -m gpuslate --sim {root} sim hold --gpus {gpus} --memory {memory} {' '.join(extra)}"


def kill_tree(p: subprocess.Popen, *pids: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait(10)


# --- A. collateral -----------------------------------------------------------------------------


@ROOT_ONLY
def test_signal_forwarder_is_refused_and_the_spared_user_lives(shared_host, other_user, tmp_path):
    """bash -c 'hold GPU 0 & runuser -u alice -- hold GPU 1 & wait': runuser forwards SIGTERM."""
    out = Path(shared_host.root.parent) / "ready"
    script = (f"{hold_cmd(shared_host.root, '0')} >> {out} & "
              f"runuser -u {other_user.pw_name} -- env PYTHONPATH={_env()['PYTHONPATH']} "
              f"/usr/bin/python3 -m gpuslate --sim {shared_host.root} sim hold --gpus 1 --memory 2GiB >> {out} & "
              "wait")
    p = subprocess.Popen(["bash", "-c", script], env=gpuslate_env(), start_new_session=True)
    try:
        pids = ready_pids(out, 2)
        mine, theirs = sorted(pids, key=lambda pid: os.stat(f"/proc/{pid}").st_uid)
        assert os.stat(f"/proc/{theirs}").st_uid == other_user.pw_uid
        code, doc, err = clear("--gpus", "0", "--grace", "5")
        assert code == 0 and doc["status"] == "clean", (doc, err)
        by = {t["pid"]: t for t in doc["targets"]}
        runuser = next(pid for pid, t in by.items() if t["name"] == "runuser")
        assert by[runuser]["refused"] and "forward" in by[runuser]["refused"], by[runuser]
        assert by[runuser]["signals"][0]["outcome"] == "refused"
        assert theirs in {s["pid"] for s in doc["spared"]}
        assert is_gone(mine) and alive(theirs) and alive(runuser)
        # the refusal is in the audit log
        audit = subprocess.run([PY, "-m", "gpuslate", "audit", "--json"], capture_output=True, text=True,
                               env=gpuslate_env())
        assert "refused" in audit.stdout, audit.stdout[-2000:]
    finally:
        kill_tree(p, *locals().get("pids", []))


@ROOT_ONLY
def test_namespace_init_with_spared_members_is_never_signaled(shared_host, other_user):
    """unshare --fork --pid bash -c '...': a holder on GPU 0, a monitor and another user's holder on
    GPU 1 share the namespace; clear --gpus 0 ends the holder, never the init (that would end all)."""
    out = Path(shared_host.root.parent) / "ready"
    inner = (f"{hold_cmd(shared_host.root, '0')} >> {out} & "
             f"{hold_cmd(shared_host.root, '0-1', '0')} >> {out} & "
             f"setpriv --reuid={other_user.pw_uid} --regid={other_user.pw_gid} --clear-groups "
             f"env PYTHONPATH={_env()['PYTHONPATH']} /usr/bin/python3 -m gpuslate --sim {shared_host.root} "
             f"sim hold --gpus 1 --memory 2GiB >> {out} & wait")
    p = subprocess.Popen(["unshare", "--fork", "--pid", "bash", "-c", inner], env=gpuslate_env(),
                         start_new_session=True)
    try:
        pids = ready_pids(out, 3)
        code, plan, err = clear("--gpus", "0", "--dry-run")
        init = next(t["pid"] for t in plan["targets"] if t["name"] == "bash")
        code, doc, err = clear("--gpus", "0", "--grace", "3")
        assert code == 0 and doc["status"] == "clean", (doc, err)
        by = {t["pid"]: t for t in doc["targets"]}
        assert by[init]["refused"] and "namespace" in by[init]["refused"]
        holder0 = next(pid for pid in pids if pid in by and by[pid]["role"] == "holder")
        others = [pid for pid in pids if pid != holder0]
        assert is_gone(holder0) and all(alive(q) for q in others) and alive(init)
    finally:
        kill_tree(p)


# --- B. groups that mean nothing ---------------------------------------------------------------


@ROOT_ONLY
def test_group_zero_inside_a_namespace_merges_nothing(sim_host, tmp_path):
    """Inside `unshare -fp --mount-proc`, every pgid reads 0: clear --pid A must not end job B."""
    result = tmp_path / "result.json"
    inner = textwrap.dedent(f"""\
        {hold_cmd(sim_host.root, '0')} > {tmp_path}/a &
        {hold_cmd(sim_host.root, '1')} > {tmp_path}/b &
        while ! test -s {tmp_path}/a || ! test -s {tmp_path}/b; do sleep 0.01; done
        a=$({PY} -c "import json;print(json.load(open('{tmp_path}/a'))['pid'])")
        b=$({PY} -c "import json;print(json.load(open('{tmp_path}/b'))['pid'])")
        {PY} -m gpuslate clear --pid $a --json --yes > {result}
        kill -0 $b && echo "b-alive" > {tmp_path}/b-state
        kill -0 $a 2>/dev/null && test "$(cut -d' ' -f3 /proc/$a/stat)" != Z && echo "a-alive" > {tmp_path}/a-state
        true
    """)
    r = subprocess.run(["unshare", "--fork", "--pid", "--mount-proc", "bash", "-c", inner], env=gpuslate_env(),
                       capture_output=True, text=True, timeout=60)
    doc = json.loads(result.read_text())
    assert doc["status"] == "clean", (doc, r.stderr)
    assert (tmp_path / "b-state").exists() and not (tmp_path / "a-state").exists(), (doc, r.stderr)
    assert all(t["pid"] != 0 for t in doc["targets"]) and len(doc["targets"]) == 1


def test_caller_whose_group_leader_exited_keeps_its_other_child(sim_host, tmp_path):
    """`python caller.py & exit` in a script: the caller's group has no leader; it starts A and C
    and clears A: C lives."""
    caller = tmp_path / "caller.py"
    caller.write_text(textwrap.dedent(f"""\
        import json, os, subprocess, sys
        def start(gpu):
            p = subprocess.Popen([{PY!r}, "-m", "gpuslate", "--sim", {str(sim_host.root)!r}, "sim", "hold",
                                  "--gpus", gpu, "--memory", "1GiB"], stdout=subprocess.PIPE, text=True)
            return p, json.loads(p.stdout.readline())["pid"]
        a, apid = start("0")
        c, cpid = start("1")
        r = subprocess.run([{PY!r}, "-m", "gpuslate", "clear", "--pid", str(apid), "--json", "--yes"],
                           capture_output=True, text=True)
        a.wait(10)
        out = {{"rc": r.returncode, "doc": json.loads(r.stdout), "c_alive": c.poll() is None, "c": cpid}}
        c.kill(); c.wait()
        open({str(tmp_path / 'out.json')!r}, "w").write(json.dumps(out))
    """))
    r = subprocess.run(["bash", "-c", f"{PY} {caller} & exit"], env=gpuslate_env(), start_new_session=True,
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 0
    out = json.loads(wait_for(lambda: (tmp_path / "out.json").exists() and (tmp_path / "out.json").read_text(),
                              timeout=60))
    assert out["rc"] == 0 and out["c_alive"], out
    assert [t["role"] for t in out["doc"]["targets"]] == ["holder"]


# --- C. identity by number ---------------------------------------------------------------------


def test_fork_watch_takes_a_parent_by_identity_not_pid(tmp_path):
    """A victim's pid now names another process (its start time differs) that forks: the child is
    not adopted as "forked while stopping"."""
    stranger = subprocess.Popen([PY, "-c", "import os, sys, time; sys.stdin.readline(); "
                                 "os.fork() or time.sleep(30); time.sleep(30)"], stdin=subprocess.PIPE, text=True)
    try:
        st = read_stat(stranger.pid)
        assert st is not None
        victim = Victim(ProcessId(stranger.pid, st.start_ticks - 1), {"pid": stranger.pid}, None, stranger.pid)
        plan = Plan([], [], [], None, Selection(), frozenset(int(p) for p in os.listdir("/proc") if p.isdigit()))  # type: ignore[arg-type]
        watch = _ForkWatch(plan)
        stranger.stdin.write("go\n")
        stranger.stdin.flush()
        wait_for(lambda: any(read_stat(int(p)) and read_stat(int(p)).ppid == stranger.pid  # type: ignore[union-attr]
                             for p in os.listdir("/proc") if p.isdigit()))
        assert watch([victim]) == []
        # the same child, with the parent's true identity, is adopted
        real = Victim(ProcessId(stranger.pid, st.start_ticks), {"pid": stranger.pid}, None, stranger.pid)
        watch = _ForkWatch(plan)
        assert [v.ident.pid for v in watch([real])] != []
    finally:
        subprocess.run(["pkill", "-KILL", "-P", str(stranger.pid)], check=False)
        stranger.kill()
        stranger.wait()


# --- D. protection from kernel facts -----------------------------------------------------------


@ROOT_ONLY
def test_container_pid_2_is_a_process_not_a_kernel_thread(sim_host, tmp_path):
    """In a container with an init, the server is PID 2: it is cleared, not taken for a kernel thread."""
    result = tmp_path / "result.json"
    inner = (f"{hold_cmd(sim_host.root, '0')} > {tmp_path}/a & "
             f"while ! test -s {tmp_path}/a; do sleep 0.01; done; "
             f"{PY} -m gpuslate clear --gpus 0 --json --yes > {result}; echo rc=$?")
    r = subprocess.run(["unshare", "--fork", "--pid", "--mount-proc", "bash", "-c", inner], env=gpuslate_env(),
                       capture_output=True, text=True, timeout=60)
    doc = json.loads(result.read_text())
    assert "rc=0" in r.stdout and doc["status"] == "clean", (doc, r.stderr)
    assert [t["pid"] for t in doc["targets"]] == [2]


def test_a_job_titled_sshd_is_cleared_and_a_real_program_is_what_protects(sim_host, hold, cli):
    job = hold("--gpus", "0", "--memory", "2GiB", "--title", "sshd")
    code, doc, err = clear("--gpus", "0", "--all-users")
    assert code == 0 and [t["pid"] for t in doc["targets"]] == [job.pid], (doc, err)
    assert is_gone(job.pid)
    # a holder that *is* sshd (its program) is spared whatever it calls itself
    daemon = hold("--gpus", "1", "--memory", "2GiB", "--title", "python", program="sshd")
    code, doc, err = clear("--gpus", "1", "--all-users", "--timeout", "2")
    assert code == 4 and doc["targets"] == [], (doc, err)
    assert "session or container infrastructure (sshd)" in doc["spared"][0]["reason"] and alive(daemon.pid)


def test_shell_option_arguments_are_not_scripts(sim_host, tmp_path):
    """`bash -o posix` reading commands from a person: its option's argument is no script, so the
    shell is interactive and survives; the holder it started is cleared."""
    ready = tmp_path / "ready"
    p = subprocess.Popen(["bash", "-o", "posix"], stdin=subprocess.PIPE, text=True, env=gpuslate_env(),
                         start_new_session=True)
    try:
        assert p.stdin is not None
        p.stdin.write(f"{hold_cmd(sim_host.root, '0')} > {ready}\n")
        p.stdin.flush()
        (pid,) = ready_pids(ready, 1)
        code, doc, err = clear("--gpus", "0")
        assert code == 0, (doc, err)
        assert p.pid not in {t["pid"] for t in doc["targets"]}
        assert is_gone(pid) and p.poll() is None
    finally:
        p.kill()
        p.wait()


# --- G. no success without evidence ------------------------------------------------------------


@ROOT_ONLY
def test_pid_of_another_users_holder_is_nothing_selected(shared_host, other_user):
    p, pid = start_as(other_user, shared_host, "1")
    try:
        code, doc, err = clear("--pid", str(pid))
        assert code == 4 and doc["status"] == "nothing_selected" and doc["targets"] == [], (doc, err)
        assert alive(pid)
        r = subprocess.run([PY, "-m", "gpuslate", "clear", "--yes", "--pid", str(pid)], capture_output=True,
                           text=True, env=gpuslate_env())
        assert r.returncode == 4 and "Nothing you may signal was selected" in r.stdout, r.stdout
        assert "Clean" not in r.stdout
    finally:
        p.kill()
        p.wait()


class _FillsUp:
    """An audit log whose disk fills after the first phase."""

    def __init__(self) -> None:
        self.calls = 0

    def before_signals(self, **_kw: object) -> list[str]:
        self.calls += 1
        if self.calls > 1:
            raise PermissionDenied("cannot write the audit log: No space left on device",
                                   hint="no signal was sent")
        return ["e"]

    def outcomes(self, _results: object) -> None:
        pass


def test_audit_log_full_between_phases_says_what_was_sent():
    p = subprocess.Popen([PY, "-c", "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                          "print(1, flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline()
        st = read_stat(p.pid)
        assert st is not None
        with pytest.raises(PermissionDenied) as info:
            terminate([Victim(st.ident, {"pid": p.pid})], grace=0.2, kill_wait=1, action="clear", run_id="r",
                      audit=_FillsUp())  # type: ignore[arg-type]
        assert "SIGKILL was not sent" in (info.value.hint or "") and str(p.pid) in (info.value.hint or "")
        assert "no signal was sent" not in (info.value.hint or "")
        assert p.poll() is None  # never SIGKILLed unaudited
    finally:
        p.kill()
        p.wait()


# --- H. bounded work ---------------------------------------------------------------------------


def test_match_against_a_huge_argv_is_bounded(sim_host, tmp_path):
    huge = ["x" * 120_000] * 5  # 600 KB of argv (one argument is at most 128 KiB)
    code = (f"import sys; sys.argv = ['gpuslate', '--sim', {str(sim_host.root)!r}, 'sim', 'hold', '--gpus', '0', "
            "'--memory', '1GiB']; from gpuslate.cli.main import main; sys.exit(main())")
    p = subprocess.Popen([PY, "-c", code, "vllm", *huge], stdout=subprocess.PIPE, text=True, env=gpuslate_env(),
                         start_new_session=True)
    try:
        assert p.stdout is not None and json.loads(p.stdout.readline())
        t0 = time.monotonic()
        rc, doc, err = clear("--match", "x*serve", "--dry-run", "--timeout", "2")  # quadratic in the argv
        assert time.monotonic() - t0 < 5 and rc == 0, (doc, err)
    finally:
        p.kill()
        p.wait()


def test_a_target_that_becomes_sshd_before_the_act_is_refused(sim_host, tmp_path):
    """Protection is checked again at the act: a holder that execs into a program that is
    protected (here a copy of the interpreter named sshd) between the plan and the signal is
    not signaled."""
    import gpuslate
    from helpers import program_named

    sshd = program_named("sshd", tmp_path / "programs")
    ready = tmp_path / "ready"
    p = subprocess.Popen([PY, "-c", textwrap.dedent(f"""\
        import os, subprocess, sys
        h = subprocess.Popen([{PY!r}, "-m", "gpuslate", "--sim", {str(sim_host.root)!r}, "sim", "hold",
                              "--gpus", "0", "--memory", "1GiB"], stdout=open({str(ready)!r}, "w"))
        sys.stdin.readline()
        os.execv({sshd!r}, [{sshd!r}, "-c", "import time; time.sleep(60)"])
    """)], stdin=subprocess.PIPE, text=True, env=gpuslate_env(), start_new_session=True)
    try:
        (holder,) = ready_pids(ready, 1)

        def confirm(plan: object) -> bool:
            assert p.stdin is not None
            p.stdin.write("exec\n")
            p.stdin.flush()
            wait_for(lambda: os.readlink(f"/proc/{p.pid}/exe").endswith("/sshd"))
            return True

        result = gpuslate.clear([0], grace=2, timeout=5, confirm=confirm)
        by = {r.victim.ident.pid: r for r in result.results}
        assert p.pid in by and by[p.pid].refused and "sshd" in by[p.pid].refused, result.to_json()
        assert is_gone(holder) and p.poll() is None
    finally:
        kill_tree(p)


def test_a_thread_that_execs_sshd_after_its_leader_exited_is_refused(sim_host, tmp_path):
    """The same, where the launcher's main thread had exited (issue 24) and one of its threads execs:
    the kernel gives that thread the process's pid and start time, so it is the same process, now
    running sshd, and the act-time gate refuses it; the holder below it is ended."""
    import gpuslate
    from gpuslate.proc.procfs import read_stat
    from helpers import program_named

    sshd = program_named("sshd", tmp_path / "programs")
    ready = tmp_path / "ready"
    p = subprocess.Popen([PY, "-c", textwrap.dedent(f"""\
        import ctypes, os, subprocess, sys, threading
        h = subprocess.Popen([{PY!r}, "-m", "gpuslate", "--sim", {str(sim_host.root)!r}, "sim", "hold",
                              "--gpus", "0", "--memory", "1GiB"], stdout=open({str(ready)!r}, "w"))
        def later():
            sys.stdin.readline()
            os.execv({sshd!r}, [{sshd!r}, "-c", "import time; time.sleep(60)"])
        threading.Thread(target=later).start()
        ctypes.CDLL(None).pthread_exit(None)
    """)], stdin=subprocess.PIPE, text=True, env=gpuslate_env(), start_new_session=True)
    try:
        (holder,) = ready_pids(ready, 1)
        wait_for(lambda: read_stat(p.pid).leader_exited)
        ticks = read_stat(p.pid).start_ticks

        def confirm(plan: object) -> bool:
            assert p.pid in {t.ident.pid for t in plan.targets}  # type: ignore[attr-defined]
            assert p.stdin is not None
            p.stdin.write("exec\n")
            p.stdin.flush()
            def execed() -> bool:  # the exec made the thread its leader, then switched its program
                try:
                    return not read_stat(p.pid).leader_exited and os.readlink(f"/proc/{p.pid}/exe").endswith("/sshd")
                except FileNotFoundError:
                    return False

            wait_for(execed)
            assert read_stat(p.pid).start_ticks == ticks
            return True

        result = gpuslate.clear([0], grace=2, timeout=5, confirm=confirm)
        by = {r.victim.ident.pid: r for r in result.results}
        assert p.pid in by and by[p.pid].refused and "sshd" in by[p.pid].refused, result.to_json()
        assert is_gone(holder) and p.poll() is None
    finally:
        kill_tree(p)


@ROOT_ONLY
def test_a_users_own_program_named_sshd_protects_nothing(sim_host, hold, other_user):
    """Anyone can copy a program to ~/bin/sshd; only root can make the copy root's. A holder whose
    program is a user's file named sshd is cleared; the same copy made root's is protected."""
    from helpers import program_named

    exe = program_named("sshd", sim_host.root.parent / "programs")
    os.chown(exe, other_user.pw_uid, -1)
    job = hold("--gpus", "0", "--memory", "1GiB", program="sshd")
    assert os.readlink(f"/proc/{job.pid}/exe").endswith("/sshd")
    code, doc, err = clear("--gpus", "0")
    assert code == 0 and [t["pid"] for t in doc["targets"]] == [job.pid], (doc, err)
    os.chown(exe, 0, -1)
    daemon = hold("--gpus", "1", "--memory", "1GiB", program="sshd")
    code, doc, err = clear("--gpus", "1", "--timeout", "2")
    assert code == 4 and doc["targets"] == [] and alive(daemon.pid), (doc, err)


def test_a_stopped_target_is_killed_early_not_after_the_grace(sim_host, hold):
    job = hold("--gpus", "2", "--memory", "1GiB")
    os.kill(job.pid, signal.SIGSTOP)
    wait_for(lambda: (read_stat(job.pid) or read_stat(1)).state in ("T", "t"))  # type: ignore[union-attr]
    code, doc, err = clear("--gpus", "2", "--grace", "20")
    assert code == 0, (doc, err)
    (t,) = doc["targets"]
    assert "stopped" in t["ignores_sigterm"] and doc["timings"]["total_s"] < 5


@ROOT_ONLY
def test_a_refused_holder_is_no_success(shared_host, other_user):
    """Fuzzer seed 2006's shape: a holder that forwards SIGTERM to another user's child is refused;
    it still holds its memory, so the run is `refused` (exit 4), never `clean`."""
    out = Path(shared_host.root.parent) / "ready"
    forwarder = textwrap.dedent(f"""\
        import json, os, signal, subprocess, sys, time
        sys.argv = ["gpuslate", "--sim", {str(shared_host.root)!r}, "sim", "hold", "--gpus", "0", "--memory", "2GiB"]
        kid = subprocess.Popen(["setpriv", "--reuid={other_user.pw_uid}", "--regid={other_user.pw_gid}",
                                "--clear-groups", "sleep", "300"])
        signal.signal(signal.SIGTERM, lambda *_: kid.send_signal(signal.SIGTERM))
        from gpuslate.cli.main import main
        main()
    """)
    p = subprocess.Popen([PY, "-c", forwarder], stdout=open(out, "w"), env=gpuslate_env(), start_new_session=True)
    try:
        (holder,) = ready_pids(out, 1)
        for args in (("--pid", str(holder)), ("--gpus", "0")):
            t0 = time.monotonic()
            code, doc, err = clear(*args, "--timeout", "30")
            assert code == 4 and doc["status"] == "refused", (args, doc, err)
            assert time.monotonic() - t0 < 5  # said at once, not after the timeout
            assert any("refused at act time" in pr["reason"] for d in doc["diagnosis"] for pr in d["problems"])
            assert alive(holder)
    finally:
        kill_tree(p)
