"""The hostile MPS cases of issues 32 and 37 on a real GPU (``pytest -m gpu -s`` on the device, as root):
every process here is started by the test and ended by it, also when it fails; every clear either
selects by ``--pid`` or is a dry run. Each test prints ``GPU-RECORD {json}`` lines of what the real
driver showed (and appends them to ``$GPUSLATE_GPU_RECORD`` when set), to compare with the simulated
host.

**A client that renames itself** (its MPS pipe folder unreadable). A torch MPS client renames itself
once it holds its memory, as SGLang's and vLLM's workers do with setproctitle: the title is written
over its argument and environment area, so ``/proc/PID/environ`` no longer names its
``CUDA_MPS_PIPE_DIRECTORY`` (mpskit.MPS_CLIENT; by hand where py-setproctitle is not installed). As
root gpuslate can read every environment, so a title written over it is how a root caller loses a
client's pipe folder; the test checks that it did (``read_client_pipe`` is unknown) before anything
else.

* One private daemon, a renamed client ``a`` and a plain one ``b``: a dry run of GPU 0 spares the
  server; ``--pid SERVER --include-handles`` (dry) targets nothing, and the server is spared naming
  both clients; ``--pid b --pid SERVER --include-handles`` (real) ends ``b`` alone, and ``a`` still
  runs a kernel; ``--pid a`` (real) ends ``a``. The server is never signaled: no audit entry names
  it and it is the same process (pid and start time) at the end.
* Two private daemons of one user (pipes ``a/`` and ``b/``, as NVIDIA documents for several servers
  of one user), the renamed client of server A and a plain client of server B: status names B's
  client's server and no server for the renamed client (it cannot be told); ``--pid b --pid SERVER_B
  --include-handles`` (real) ends ``b`` and spares server B, because the renamed client could be
  its client (issue 32: both servers were SIGTERMed); then ``--pid SERVER_A --pid SERVER_B
  --include-handles`` (real) ends neither. Neither server is ever signaled.

**Daemon look-alikes** (another user's process running a daemon's program: a user made for the test,
removed after; as root, said in the record, where that user cannot use the GPU):

* *exec*: a torch process holds 1 GiB, then execs ``nvidia-smi -l 3600`` or
  ``nvidia-cuda-mps-server``, once with its descriptors as the driver opened them and once with
  FD_CLOEXEC cleared on each ``/dev/nvidia*`` descriptor ("keeping its descriptors"). Recorded: each
  driver descriptor and whether it was close-on-exec, whether the process lived on, its descriptors
  and NVML's lists after the exec, and whether the memory survived it.
* *LD_PRELOAD*: a library compiled here (``cc``) whose constructor dlopens libcuda.so.1, makes a
  context (cuInit, cuDeviceGet, cuDevicePrimaryCtxRetain, cuCtxSetCurrent), allocates and writes
  1 GiB (cuMemAlloc_v2, cuMemsetD8_v2) and then blocks forever, preloaded into the real
  ``nvidia-smi`` and ``nvidia-cuda-mps-server``: the memory is held under the daemon's program.

For every look-alike: it is never in a baseline (status, ``wait --free``, ``clear --all-users
--dry-run``, library and CLI); where it holds memory, ``wait --free`` does not succeed; where NVML
lists it, the dry run makes it a target or spares it as a daemon that status names unproven (as
another user; run as root, only the cap keeps its memory held, and the record says so).

What the simulated host does in these shapes (tests/clearing/test_mps.py, tests/gpu/simhost/): a
holder's driver descriptors are close-on-exec, so an exec without clearing FD_CLOEXEC releases its
memory and NVML stops listing it; one that clears it keeps its memory and stays listed under its pid.
Each exec record says whether the real driver did the same (``same_as_simulated``).
"""

from __future__ import annotations

import json
import os
import pwd
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import gpuslate
from gpuslate.clearing.plan import MPS_SHARED
from gpuslate.host.audit import AuditLog
from gpuslate.host.daemons import BASELINE_CAP
from gpuslate.proc.daemons import exe_daemon, read_client_pipe
from gpuslate.proc.procfs import read_exe, read_stat
from helpers import gpuslate_env, per_worker, throwaway_user
from mpskit import SERVER, Client, GiB, MiB, Mps, gone, nvml_view, record

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]
TITLE = "sglang::scheduler_TP0"
SMI = "nvidia-smi"
#: how long the driver is given to release a process's memory before the test calls it kept
RELEASE_S = 20.0


# -- helpers -------------------------------------------------------------------------------------------------

def listed(pid: int) -> Any:
    """The process ``pid`` as gpuslate's status lists it on GPU 0 (None: not listed)."""
    return {p.pid: p for p in gpuslate.status([0]).gpus[0].processes}.get(pid)


def proc_facts(p: Any) -> dict[str, Any] | None:
    if p is None:
        return None
    return {k: getattr(p, k) for k in ("pid", "kind", "used_memory", "user", "name", "daemon", "daemon_unproven",
                                       "mps_server")}


def audited() -> set[int]:
    """The pids every audit entry of this test's state folder names as a target."""
    log = AuditLog(Path(os.environ["GPUSLATE_STATE_DIR"]) / "audit.jsonl", backend="nvml")
    return {e["target"]["pid"] for e in log.read()}


def start_ticks(pid: int) -> int | None:
    st = read_stat(pid)
    return st.start_ticks if st is not None else None


def spared_reason(result: Any, pid: int) -> str | None:
    return {s.pid: s.reason for s in result.plan.spared}.get(pid)


def targets(result: Any) -> list[int]:
    return [t.ident.pid for t in result.plan.targets]


def cli(*args: str) -> tuple[int, dict[str, Any] | None, str]:
    r = subprocess.run([sys.executable, "-m", "gpuslate", *args, "--json"], capture_output=True, text=True,
                       env=gpuslate_env({"GPUSLATE_SIM": ""}), timeout=120)
    try:
        return r.returncode, json.loads(r.stdout), r.stderr[-500:]
    except ValueError:
        return r.returncode, None, (r.stdout + r.stderr)[-500:]


def program_path(name: str) -> str | None:
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/bin", "/usr/local/nvidia/bin", "/usr/sbin"])
    found = shutil.which(name, path=path)
    return os.path.realpath(found) if found else None


def driver_fds(pid: int) -> list[str]:
    """What ``pid``'s descriptors to the driver's device files are (``/dev/nvidia...``)."""
    out: list[str] = []
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for n in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{n}")
        except OSError:
            continue
        if target.startswith("/dev/nvidia"):
            out.append(f"{n}:{target}")
    return sorted(out, key=lambda s: int(s.split(":")[0]))


def read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline().strip() if ready else ""


def end(proc: subprocess.Popen[str]) -> None:
    """SIGKILL a look-alike this test started (its own session) and wait until the driver lets its memory go."""
    if proc.returncode is None:  # not reaped yet: its pid (and group) is still its own
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and listed(proc.pid) is not None:
        time.sleep(0.2)


# -- the second user ------------------------------------------------------------------------------------------

class Runner:
    """Who the look-alikes run as: a second user made for the module (``user``), or root where that
    user cannot use the GPU (``why_root`` says why); ``home`` is a folder that user owns."""

    def __init__(self, user: pwd.struct_passwd | None, why_root: str | None, home: Path) -> None:
        self.user = user
        self.why_root = why_root
        self.home = home

    @property
    def name(self) -> str:
        return self.user.pw_name if self.user else "root"

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The test's environment (the leak check's markers, the driver's library path) less what would
        change the shape: no preload, no MPS pipe (the look-alikes use no MPS), every GPU visible (GPU 0
        as NVML counts), no title switch; HOME a folder the look-alike's user owns."""
        drop = ("LD_PRELOAD", "LD_AUDIT", "CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY",
                "SPT_NOENV", "GPUSLATE_SIM")
        env = {k: v for k, v in os.environ.items() if k not in drop}
        env["HOME"] = str(self.home)
        env.update(extra or {})
        return env

    def popen(self, args: list[str], *, env: dict[str, str], stderr: Any) -> subprocess.Popen[str]:
        kw: dict[str, Any] = {}
        if self.user is not None:
            kw = {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}
        return subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                env=env, cwd=str(self.home), start_new_session=True, **kw)


PROBE = "import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize(); print('ok')"


@pytest.fixture(scope="module")
def runner() -> Iterator[Runner]:
    home = Path(tempfile.mkdtemp(prefix="gpuslate-lookalike-"))
    home.chmod(0o755)
    try:
        if os.geteuid() != 0 or not shutil.which("useradd"):
            yield Runner(None, "no second user: not root, or no useradd", home)
            return
        with throwaway_user(per_worker("gpuslate-lookalike")) as user:
            os.chown(home, user.pw_uid, user.pw_gid)
            r = Runner(user, None, home)
            try:
                probe = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=180,
                                       env=r.env(), cwd=str(home), user=user.pw_uid, group=user.pw_gid,
                                       extra_groups=[])
                why = None if probe.stdout.strip() == "ok" else \
                    f"{user.pw_name} cannot use torch on the GPU: {(probe.stderr or probe.stdout).strip()[-300:]}"
            except subprocess.TimeoutExpired:
                why = f"{user.pw_name}'s torch probe did not finish in 180 s"
            if why is not None:
                os.chown(home, 0, 0)
                r = Runner(None, why, home)
            record("lookalike runner", user=r.name, why_root=r.why_root)
            yield r
    finally:
        shutil.rmtree(home, ignore_errors=True)


# -- 1. a client that renames itself --------------------------------------------------------------------------

def renamed_client(m: Mps, nbytes: int) -> Client:
    c = m.client(nbytes, TITLE)
    with open(f"/proc/{c.pid}/comm") as f:
        comm = f.read().strip()
    pipe = read_client_pipe(c.pid)
    assert not c.how.startswith("failed") and pipe is None, \
        f"the client's environment still names its pipe folder ({c.how}; read as {pipe!r}): the test cannot run"
    assert comm == TITLE[:15], comm
    return c


def test_a_renamed_client_keeps_its_server_from_every_clear(mps: Mps) -> None:
    a = renamed_client(mps, GiB)
    b = mps.client(GiB)
    servers = mps.servers()
    assert len(servers) == 1, f"MPS servers of this test's control daemon: {servers}; {mps.log_tail()}"
    (server,) = servers
    born = start_ticks(server)
    procs = {p.pid: p for p in gpuslate.status([0]).gpus[0].processes}
    record("renamed client, one server", renamed_how=a.how, client_pipe=read_client_pipe(a.pid),
           other_pipe=read_client_pipe(b.pid), nvml=nvml_view(),
           status={str(pid): proc_facts(procs.get(pid)) for pid in (server, a.pid, b.pid)})
    assert procs[a.pid].kind == "mps" and procs[b.pid].kind == "mps", (procs[a.pid], procs[b.pid])
    assert procs[server].daemon == SERVER
    assert a.work().startswith("ok"), "the renamed client could not run a kernel"

    # dry runs: the whole GPU (the caller's jobs), then the server selected with --include-handles
    r = gpuslate.clear([0], dry_run=True)
    assert server not in targets(r) and spared_reason(r, server) is not None, r.to_json()
    r = gpuslate.clear([0], pids=[server], include_handles=True, dry_run=True)
    why = spared_reason(r, server) or ""
    assert targets(r) == [] and why.startswith(MPS_SHARED) and str(a.pid) in why and str(b.pid) in why, r.to_json()
    r = gpuslate.clear([0], pids=[b.pid, server], include_handles=True, dry_run=True)
    why = spared_reason(r, server) or ""
    assert targets(r) == [b.pid] and why.startswith(MPS_SHARED) and str(a.pid) in why, r.to_json()

    # real: b and the server selected: b ends, the server is spared, the renamed client still works
    r = gpuslate.clear([0], pids=[b.pid, server], include_handles=True, grace=10, timeout=60)
    record("renamed client, one server: clear --pid b --pid server --include-handles", status=r.status.value,
           targets=targets(r), spared=spared_reason(r, server), timings=r.timings)
    assert [v.victim.ident.pid for v in r.results] == [b.pid], r.to_json()
    assert gone(b.pid) and not gone(server) and not gone(a.pid)
    answer = a.work()
    assert answer.startswith("ok"), f"the renamed client failed after the clear: {answer}; {mps.log_tail()}"

    # real: the renamed client by --pid
    r = gpuslate.clear([0], pids=[a.pid], grace=10, timeout=60)
    assert [v.victim.ident.pid for v in r.results] == [a.pid] and gone(a.pid), r.to_json()
    assert not gone(server) and start_ticks(server) == born
    assert audited() == {a.pid, b.pid}


def test_a_renamed_client_keeps_every_server_it_could_use(mps_daemons: Callable[[str], Mps]) -> None:
    """Issue 32's reproduction on real MPS: two servers of one user; the renamed client of A could be
    B's client as far as anyone can read, so B is never a target while it lives."""
    ma, mb = mps_daemons("a"), mps_daemons("b")
    a = renamed_client(ma, GiB)
    b = mb.client(GiB)
    sa, sb = ma.servers(), mb.servers()
    assert len(sa) == 1 and len(sb) == 1, f"servers: A {sa} ({ma.log_tail()}), B {sb} ({mb.log_tail()})"
    (server_a,), (server_b,) = sa, sb
    born = {s: start_ticks(s) for s in (server_a, server_b)}
    procs = {p.pid: p for p in gpuslate.status([0]).gpus[0].processes}
    record("renamed client, two servers", renamed_how=a.how, nvml=nvml_view(),
           status={str(pid): proc_facts(procs.get(pid)) for pid in (server_a, server_b, a.pid, b.pid)})
    assert procs[a.pid].kind == "mps" and procs[b.pid].kind == "mps"
    assert procs[a.pid].mps_server is None, "the renamed client's server cannot be told, yet status named one"
    assert procs[b.pid].mps_server == server_b, procs[b.pid]

    r = gpuslate.clear([0], pids=[b.pid, server_b], include_handles=True, dry_run=True)
    why = spared_reason(r, server_b) or ""
    assert targets(r) == [b.pid] and why.startswith(MPS_SHARED) and str(a.pid) in why, r.to_json()

    r = gpuslate.clear([0], pids=[b.pid, server_b], include_handles=True, grace=10, timeout=60)
    record("renamed client, two servers: clear --pid b --pid server_b --include-handles", status=r.status.value,
           targets=targets(r), spared=spared_reason(r, server_b), timings=r.timings)
    assert [v.victim.ident.pid for v in r.results] == [b.pid] and gone(b.pid), r.to_json()
    assert not gone(server_b) and not gone(server_a)
    answer = a.work()
    assert answer.startswith("ok"), f"the renamed client failed after the clear: {answer}; {ma.log_tail()}"

    r = gpuslate.clear([0], pids=[server_a, server_b], include_handles=True, grace=10, timeout=60)
    record("renamed client, two servers: clear --pid server_a --pid server_b --include-handles",
           status=r.status.value, targets=targets(r), spared={s: spared_reason(r, s) for s in (server_a, server_b)})
    assert targets(r) == [] and r.results == [], r.to_json()
    for s in (server_a, server_b):
        assert (spared_reason(r, s) or "").startswith(MPS_SHARED), r.to_json()
        assert not gone(s) and start_ticks(s) == born[s]
    assert a.work().startswith("ok")
    assert audited() == {b.pid}


# -- 2. daemon look-alikes ------------------------------------------------------------------------------------

def check_lookalike(test: str, runner: Runner, pid: int, held: bool) -> dict[str, Any]:
    """The look-alike ``pid`` is never a baseline; where it holds memory (``held``) the GPU is not free;
    where it is listed, the plan targets it or spares it as a daemon status names unproven (or, run as
    root, one whose memory is beyond the cap). Returns what was seen, for the record."""
    snap = gpuslate.status([0])
    g = snap.gpus[0]
    p = {q.pid: q for q in g.processes}.get(pid)
    seen: dict[str, Any] = {"status": proc_facts(p), "status_baseline": [h.to_json() for h in g.baseline()]}
    assert pid not in {h.pid for h in g.baseline()}, seen
    w = gpuslate.wait_free([0], timeout=5)
    seen["wait"] = {"ok": w.ok, "baseline": [h.to_json() for h in w.baseline],
                    "problems": [pr.to_json() for d in w.diagnosis for pr in d.problems]}
    assert pid not in {h.pid for h in w.baseline}, seen
    c = gpuslate.clear([0], all_users=True, dry_run=True)
    seen["clear_dry_run"] = {"targets": targets(c), "spared": spared_reason(c, pid),
                             "baseline": [h.to_json() for h in c.baseline]}
    assert pid not in {h.pid for h in c.baseline}, seen
    code, doc, err = cli("wait", "--free", "--gpus", "0", "--timeout", "5")
    seen["cli_wait"] = {"exit": code, "baseline": doc and doc.get("baseline"), "stderr": err}
    assert doc is not None and pid not in {h["pid"] for h in doc["baseline"]}, seen
    code, doc, err = cli("clear", "--all-users", "--gpus", "0", "--dry-run")
    seen["cli_clear_dry_run"] = {"exit": code, "baseline": doc and doc.get("baseline"), "stderr": err}
    assert doc is not None and pid not in {h["pid"] for h in doc["baseline"]}, seen
    record(test, runner=runner.name, why_root=runner.why_root, held=held, **seen)
    if held:
        assert not w.ok, seen
        assert seen["cli_wait"]["exit"] != 0, seen
    if p is not None:
        assert pid in targets(c) or spared_reason(c, pid) is not None, seen
        if pid not in targets(c):
            assert p.daemon is not None, f"spared, yet no daemon: {seen}"
            if runner.user is not None:
                assert p.daemon_unproven is not None, f"another user's look-alike proven a daemon: {seen}"
            else:
                assert p.daemon_unproven is not None or (p.used_memory or 0) > BASELINE_CAP, seen
        if held:
            assert pid in {pr["pid"] for pr in seen["wait"]["problems"]}, f"not named by wait: {seen}"
    return seen


EXEC_LOOKALIKE = r"""
import json, os, re, sys, torch
n, prog, mode, args = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
x = torch.empty(n, dtype=torch.uint8, device="cuda")
x.fill_(1)
torch.cuda.synchronize()
fds = []
for name in sorted(os.listdir("/proc/self/fd"), key=int):
    try:
        target = os.readlink("/proc/self/fd/" + name)
        with open("/proc/self/fdinfo/" + name) as f:
            flags = int(re.search(r"^flags:\s*([0-7]+)", f.read(), re.M).group(1), 8)
    except (OSError, AttributeError):
        continue
    if target.startswith("/dev/nvidia"):
        fds.append([int(name), target, bool(flags & 0o2000000)])  # O_CLOEXEC
        if mode == "kept":
            os.set_inheritable(int(name), True)
print(json.dumps({"fds": fds}), flush=True)
sys.stdin.readline()
os.dup2(2, 1)  # the program's output goes to the log
os.execv(prog, [prog, *args])
"""


@pytest.mark.parametrize("fds", ["driver", "kept"])
@pytest.mark.parametrize("program", [SMI, SERVER])
def test_a_process_that_execs_a_daemon_program_is_never_a_baseline(runner: Runner, program: str, fds: str,
                                                                     tmp_path: Path) -> None:
    path = program_path(program)
    if path is None:
        pytest.skip(f"{program} is not installed")
    test = f"exec look-alike: {program}, descriptors {fds}"
    before = nvml_view()
    args = ["-l", "3600"] if program == SMI else []
    log = open(tmp_path / "lookalike.log", "w+")
    proc = runner.popen([sys.executable, "-c", EXEC_LOOKALIKE, str(GiB), path, fds, *args], env=runner.env(),
                        stderr=log)
    try:
        line = read_line(proc, 180)
        log.seek(0)
        assert line.startswith("{"), f"the look-alike did not hold its memory: {line!r}; {log.read()[-1500:]}"
        opened = json.loads(line)["fds"]
        held_before = nvml_view()
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None and read_exe(proc.pid) != path:
            time.sleep(0.05)
        execd = read_exe(proc.pid) == path
        # the memory: released (the driver tears the context down when its descriptors close), or kept
        deadline = time.monotonic() + RELEASE_S
        while time.monotonic() < deadline:
            now = nvml_view()
            pids = {pid for key in ("compute", "mps") if isinstance(now.get(key), list) for pid, _ in now[key]}
            if proc.pid not in pids and now.get("used", 0) < before.get("used", 0) + GiB // 2:
                break
            time.sleep(0.2)
        after = nvml_view()
        alive = proc.poll() is None
        pids_after = {pid: used for key in ("compute", "mps") if isinstance(after.get(key), list)
                      for pid, used in after[key]}
        grew = after.get("used", 0) - before.get("used", 0)
        survived = grew > GiB // 2 or (pids_after.get(proc.pid) or 0) > GiB // 2
        # the simulated host: a live process whose descriptors were kept keeps its memory and stays listed;
        # with the driver's (close-on-exec) descriptors, or once it exited, it holds nothing
        sim = fds == "kept" and alive
        log.seek(0)
        record(test + ": what the driver did", program=path, runner=runner.name, driver_fds=opened,
               close_on_exec={t: c for _, t, c in opened}, nvml_before=before, nvml_holding=held_before,
               execd=execd, alive_after=alive, exit_code=proc.returncode, fds_after=driver_fds(proc.pid),
               nvml_after=after, listed_after=proc.pid in pids_after, memory_survived_exec=survived,
               gpu_used_grew_by_mib=grew // MiB, daemon_per_gpuslate=exe_daemon(proc.pid) if alive else None,
               same_as_simulated=survived == sim and (proc.pid in pids_after) == sim,
               log_tail=log.read()[-800:])
        check_lookalike(test, runner, proc.pid, held=survived or (alive and proc.pid in pids_after))
    finally:
        end(proc)
        log.close()


PRELOAD_C = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

static void say(const char *what, long code) {
    char line[200];
    int n = snprintf(line, sizeof line, "%s %ld\n", what, code);
    if (n > 0) {
        ssize_t w = write(1, line, (size_t)n);
        (void)w;
    }
}

static void *need(void *lib, const char *name) {
    void *f = dlsym(lib, name);
    if (f == NULL) {
        say(name, -1);
        _exit(3);
    }
    return f;
}

#define CHECK(call, name) do { CUresult rc_ = (call); if (rc_ != 0) { say("error " name, rc_); _exit(3); } } while (0)

__attribute__((constructor)) static void gpuslate_lookalike(void) {
    const char *want = getenv("GPUSLATE_LOOKALIKE_BYTES");
    if (want == NULL)
        return;
    size_t bytes = (size_t)strtoull(want, NULL, 10);
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (cuda == NULL) {
        say("error dlopen libcuda.so.1", 0);
        _exit(3);
    }
    CUresult (*cuInit)(unsigned int) = (CUresult (*)(unsigned int))need(cuda, "cuInit");
    CUresult (*cuDeviceGet)(CUdevice *, int) = (CUresult (*)(CUdevice *, int))need(cuda, "cuDeviceGet");
    CUresult (*retain)(CUcontext *, CUdevice) =
        (CUresult (*)(CUcontext *, CUdevice))need(cuda, "cuDevicePrimaryCtxRetain");
    CUresult (*current)(CUcontext) = (CUresult (*)(CUcontext))need(cuda, "cuCtxSetCurrent");
    CUresult (*alloc)(CUdeviceptr *, size_t) = (CUresult (*)(CUdeviceptr *, size_t))need(cuda, "cuMemAlloc_v2");
    CUresult (*memset8)(CUdeviceptr, unsigned char, size_t) =
        (CUresult (*)(CUdeviceptr, unsigned char, size_t))need(cuda, "cuMemsetD8_v2");
    CUresult (*sync)(void) = (CUresult (*)(void))need(cuda, "cuCtxSynchronize");
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr ptr;
    CHECK(cuInit(0), "cuInit");
    CHECK(cuDeviceGet(&dev, 0), "cuDeviceGet");
    CHECK(retain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    CHECK(current(ctx), "cuCtxSetCurrent");
    CHECK(alloc(&ptr, bytes), "cuMemAlloc_v2");
    CHECK(memset8(ptr, 1, bytes), "cuMemsetD8_v2");
    CHECK(sync(), "cuCtxSynchronize");
    say("ready", (long)(bytes >> 20));
    for (;;)
        pause();
}
"""


def compile_preload(folder: Path) -> Path:
    """The preload library, built in ``folder`` (skips the test when there is no C compiler)."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler (cc, gcc, clang) to build the LD_PRELOAD look-alike")
    src, lib = folder / "lookalike.c", folder / "lookalike.so"
    if not lib.exists():
        src.write_text(PRELOAD_C)
        r = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(lib), str(src), "-ldl"], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, f"the preload library did not build: {r.stderr[-1500:]}"
        lib.chmod(0o755)
    return lib


@pytest.mark.parametrize("program", [SMI, SERVER])
def test_code_preloaded_into_a_daemon_program_is_never_a_baseline(runner: Runner, program: str,
                                                                    tmp_path: Path) -> None:
    path = program_path(program)
    if path is None:
        pytest.skip(f"{program} is not installed")
    lib = compile_preload(runner.home)  # a folder the look-alike's user can read
    test = f"LD_PRELOAD look-alike: {program}"
    before = nvml_view()
    log = open(tmp_path / "lookalike.log", "w+")
    env = runner.env({"LD_PRELOAD": str(lib), "GPUSLATE_LOOKALIKE_BYTES": str(GiB)})
    proc = runner.popen([path], env=env, stderr=log)
    try:
        line = read_line(proc, 180)
        log.seek(0)
        if not line.startswith("ready"):
            code = proc.poll()
            record(test + ": no memory held", program=path, runner=runner.name, said=line, exit_code=code,
                   log_tail=log.read()[-800:])
            assert line == "" and code is not None, f"the preloaded constructor failed: {line!r}"
            pytest.skip(f"{program} ran without the preloaded library's constructor (exit {code}): "
                        "LD_PRELOAD not honoured by it")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and listed(proc.pid) is None:
            time.sleep(0.2)
        holding = nvml_view()
        record(test + ": what the driver did", program=path, runner=runner.name, said=line, exe=read_exe(proc.pid),
               nvml_before=before, nvml_holding=holding, fds=driver_fds(proc.pid),
               daemon_per_gpuslate=exe_daemon(proc.pid))
        assert read_exe(proc.pid) == path
        assert listed(proc.pid) is not None, f"NVML does not list the look-alike: {holding}"
        check_lookalike(test, runner, proc.pid, held=True)
    finally:
        end(proc)
        log.close()

