"""Run as PID 1 of a private PID namespace (``unshare --fork --pid --mount-proc``), as root: a unit
crashes, its main PID is handed (through ``/proc/sys/kernel/ns_last_pid``) to a stranger of another
user that calls ``setsid`` and forks, then ``ps`` and ``down`` of the unit run. Prints one JSON
line with what they saw and whether the stranger survived. Everything it started dies with the
namespace when it exits.

    pidreuse.py MODE    MODE: record (the unit's record intact) | torn (its GPU list lost, pid
                        and start time still readable) | leader (the stranger's session leader
                        stays alive, pid reused by a live process)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

NOBODY = 65534
STRANGER = ("import os, sys, time\n"
            "os.setsid()\n"  # its session and group ids are now the number the unit's main had
            "child = os.fork()\n"
            "if child == 0:\n"
            "    time.sleep(600)\n"
            "    os._exit(0)\n"
            "print(child, flush=True)\n"
            "if sys.argv[1] == 'leader':\n"
            "    time.sleep(600)\n"
            "os._exit(0)\n")


def gpuslate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuslate", *args], capture_output=True, text=True, timeout=60)


def stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rfind(")") + 2:].split()


def reap() -> None:
    """Collect the zombies of every orphan reparented to us (a zombie keeps its PID taken)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def await_(cond, what: str, timeout: float = 20.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        reap()
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out: {what}")
        time.sleep(0.005)


def main(mode: str) -> None:
    assert os.getpid() == 1, "run me as PID 1 of a new PID namespace"
    hold = [sys.executable, "-m", "gpuslate", "sim", "hold", "--gpus", "0", "--memory", "1GiB"]
    r = gpuslate("up", "web", "--gpus", "0", "--containment", "session", "--ready-log", '"pid"', "--json",
                 "--", *hold)
    assert r.returncode == 0, r.stderr
    up = json.loads(r.stdout)
    main_pid = up["pid"]
    members = [main_pid, *[int(p) for p in os.listdir("/proc") if p.isdigit() and stat(int(p))
                           and stat(int(p))[1] == str(main_pid)]]
    # the unit crashes: every process of it dies
    for pid in members:
        os.kill(pid, signal.SIGKILL)
    await_(lambda: all(stat(p) is None for p in members), "the unit's processes to be gone")
    if mode == "torn":
        path = os.path.join(os.environ["GPUSLATE_STATE_DIR"], "units", "web.json")
        doc = json.load(open(path))
        del doc["gpus"], doc["sid"]  # invalid: the pid and the start time still read
        with open(path, "w") as f:
            json.dump(doc, f)
    # hand the main's PID to a stranger: another user's program that calls setsid and forks
    for _ in range(50):
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(main_pid - 1))
        stranger = subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                                     "/usr/bin/python3", "-c", STRANGER, mode], stdout=subprocess.PIPE, text=True)
        if stranger.pid == main_pid:
            break
        stranger.kill()
        stranger.wait()
    else:
        raise SystemExit(f"could not hand pid {main_pid} over")
    child = int(stranger.stdout.readline())  # type: ignore[union-attr]
    if mode != "leader":
        stranger.wait()
        await_(lambda: stat(main_pid) is None, "the stranger's leader to exit")
    st = stat(child)
    assert st is not None and int(st[2]) == main_pid and int(st[3]) == main_pid, st  # pgid, sid
    ps = gpuslate("ps", "--json")
    down = gpuslate("down", "web", "--json", "--timeout", "5")
    reap()
    print(json.dumps({
        "main": main_pid, "stranger": child, "leader_alive": stat(main_pid) is not None,
        "ps": json.loads(ps.stdout) if ps.stdout else ps.stderr,
        "down_rc": down.returncode, "down": json.loads(down.stdout) if down.stdout else None,
        "down_err": down.stderr, "stranger_alive": stat(child) is not None,
    }))


if __name__ == "__main__":
    main(sys.argv[1])
