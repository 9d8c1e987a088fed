"""A unit command that leaves escapees: workers that double-fork, call ``setsid`` (their own
session and process group), rename themselves one way or another and hold simulated GPU memory
or the unit's port, as SGLang's schedulers and vLLM's engine cores do when their launcher is gone.

Renaming mechanisms (``how``):

* ``setproctitle``: py-setproctitle, as SGLang and vLLM call it (keeps the environment where
  ``SPT_NOENV`` is set: ``up`` sets it);
* ``setproctitle-clobber``: the same after removing ``SPT_NOENV`` (a library that does not read
  it: the environment is written over);
* ``prctl``: ``prctl(PR_SET_NAME)`` through ctypes (the kernel's 15-character name only);
* ``comm``: writing ``/proc/self/comm``;
* ``exec-a``: ``exec -a NAME`` (argv[0] only);
* ``wipe``: the process writes NULs over its own environment area (``env_start`` to ``env_end``
  of ``/proc/self/stat``);
* ``env-i``: re-executed with an empty environment (``env -i``).

A ``-late`` suffix (``wipe-late``, ``setproctitle-clobber-late``) makes a worker that escapes only
later: it stays in the unit's session (a double fork away from the main process, its marker
readable) until ``OUT/NAME.go`` exists, then calls ``setsid`` and renames itself that way, and
writes ``OUT/NAME.done``: what a scan found of it before is all that can still tie it to the unit.

Each escapee writes ``PID`` to ``OUT/NAME.ready`` once it holds what it holds; the main process
prints ``serving`` once every one has, then sleeps. One whose name starts with ``after`` is started
only once ``OUT/NAME.spawn`` exists, after ``serving`` (after the unit is ready).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from helpers import SRC

WORKER = r"""
import ctypes, os, socket, sys, time
how, gpu, port, ready = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
sys.path[:0] = [%(src)r]
title = "sglang::scheduler_TP0"
late = how.endswith("-late")
how = how.removesuffix("-late")
hold = None


def hold_and_say_ready():
    global hold
    if gpu != "-":
        from gpuslate.gpu.simhost.host import SimHost
        host = SimHost(%(sim)r)
        dev = [os.open(host.dev / "nvidiactl", os.O_RDONLY), os.open(host.device_path(int(gpu)), os.O_RDONLY)]
        hold = (dev, host.allocate([(int(gpu), 1 << 30)]))
    if port != "-":
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", int(port)))
        s.listen()
        hold = (hold, s)
    with open(ready + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(ready + ".tmp", ready)


if late:
    hold_and_say_ready()
    while not os.path.exists(ready + ".go"):
        time.sleep(0.01)
    os.setsid()
if how == "setproctitle":
    import setproctitle; setproctitle.setproctitle(title)
elif how == "setproctitle-clobber":
    os.environ.pop("SPT_NOENV", None)  # unsetenv: setproctitle reads getenv when it sets up
    import setproctitle; setproctitle.setproctitle(title)
elif how == "prctl":
    ctypes.CDLL(None).prctl(15, b"renamed-prctl", 0, 0, 0)
elif how == "comm":
    with open("/proc/self/comm", "w") as f:
        f.write("renamed-comm")
elif how == "wipe":
    fields = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
    start, end = int(fields[47]), int(fields[48])  # env_start, env_end (fields 50 and 51)
    ctypes.memset(start, 0, end - start)
if late:
    open(ready + ".done", "w").close()
else:
    hold_and_say_ready()
while True:
    time.sleep(3600)
"""

MAIN = r"""
import json, os, sys, time
worker, specs, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]


def spawn(name, how, gpu, port):
    if os.fork() == 0:
        if not how.endswith("-late"):
            os.setsid()  # its own session and process group (a late one: later)
        if os.fork() == 0:  # the grandchild: reparented to init once the middle one exits
            ready = os.path.join(out, name + ".ready")
            argv = [sys.executable, "-c", worker, how, str(gpu), str(port), ready]
            if how == "exec-a":
                os.execv(sys.executable, ["renamed-argv0", *argv[1:]])
            if how == "env-i":
                os.execve(sys.executable, argv, {})
            os.execv(sys.executable, argv)
        os._exit(0)
    os.wait()


now = [s for s in specs if not s[0].startswith("after")]
for spec in now:
    spawn(*spec)
while not all(os.path.exists(os.path.join(out, s[0] + ".ready")) for s in now):
    time.sleep(0.01)
print("serving", flush=True)
for spec in specs:  # one named after...: started once OUT/NAME.spawn exists (after readiness)
    if spec not in now:
        while not os.path.exists(os.path.join(out, spec[0] + ".spawn")):
            time.sleep(0.01)
        spawn(*spec)
time.sleep(3600)
"""


def command(out: Path, sim: Path, *specs: tuple[str, str, int | None, int | None]) -> list[str]:
    """The unit's command: one escapee per ``(name, how, gpu, port)``."""
    worker = WORKER % {"src": SRC, "sim": str(sim)}
    return [sys.executable, "-c", MAIN, worker,
            json.dumps([[n, how, "-" if g is None else g, "-" if p is None else p] for n, how, g, p in specs]),
            str(out)]


def ready_pids(out: Path) -> dict[str, int]:
    """name -> pid of every escapee that said it is ready."""
    return {p.name[:-len(".ready")]: int(p.read_text()) for p in out.glob("*.ready")}


def spawn_now(out: Path, name: str) -> int:
    """Start the escapee ``name`` (one named ``after...``) now; its pid, once it is ready."""
    from helpers import wait_for

    (out / f"{name}.spawn").touch()
    wait_for(lambda: (out / f"{name}.ready").exists(), timeout=20)
    return ready_pids(out)[name]


def escape_now(out: Path, name: str) -> None:
    """Tell the late escapee ``name`` to call setsid and rename itself; return once it has."""
    from helpers import wait_for

    (out / f"{name}.ready.go").touch()
    wait_for(lambda: (out / f"{name}.ready.done").exists(), timeout=10)
