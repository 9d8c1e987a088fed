"""The act-time gate against real CUDA processes (issue 15): a target whose signal would end a
spared process is refused, what it started is ended, and the GPU is verified free.

Every target is selected by --pid of a process the test started.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpuprocs import NVML_MONITOR, TORCH_HOLDER, Started
from helpers import gpuslate_env

pytestmark = pytest.mark.gpu
GiB = 1024**3

# a holder and a monitor that do not read stdin (started in the background by a shell)
HOLDER = TORCH_HOLDER.replace("sys.stdin.read()", "import time; time.sleep(3600)")
MONITOR = NVML_MONITOR.replace("sys.stdin.read()", "import time; time.sleep(3600)")
# a launcher that forwards SIGTERM to its children (like runuser, timeout, torchrun)
FORWARDER = textwrap.dedent("""\
    import os, signal, subprocess, sys, time
    kids = [subprocess.Popen([sys.executable, "-c", code, *a], stdout=open(out, "a"))
            for code, a, out in ((sys.argv[1], [sys.argv[3]], sys.argv[4]), (sys.argv[2], [], sys.argv[4]))]
    def forward(sig, _frame):
        for k in kids:
            k.send_signal(sig)
        sys.exit(0)
    signal.signal(signal.SIGTERM, forward)
    time.sleep(3600)
""")


def gone(pid: int) -> bool:
    from gpuslate.proc.procfs import read_stat

    st = read_stat(pid)
    return st is None or st.state == "Z"


def wait_ready(path: Path, n: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().count("ready") >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"helpers not ready: {path.read_text() if path.exists() else ''}")


def clear(*args: str) -> tuple[int, dict]:
    r = subprocess.run([sys.executable, "-m", "gpuslate", "clear", "--json", "--yes", *args], capture_output=True,
                       text=True, env=gpuslate_env({"GPUSLATE_SIM": ""}), timeout=120)
    return r.returncode, json.loads(r.stdout)


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(x) for x in out]


def test_forwarder_above_a_monitor_is_refused_its_holder_is_cleared(started, tmp_path):
    ready = tmp_path / "ready"
    p = subprocess.Popen([sys.executable, "-c", FORWARDER, HOLDER, MONITOR, str(4 * GiB), str(ready)],
                         start_new_session=True, stdin=subprocess.DEVNULL)
    started.append(Started(p))  # type: ignore[arg-type]
    wait_ready(ready, 2)
    t0 = time.perf_counter()
    code, doc = clear("--gpus", "0", "--pid", str(p.pid), "--grace", "10")
    wall = time.perf_counter() - t0
    by = {t["pid"]: t for t in doc["targets"]}
    print(f"\nforwarder: exit {code} in {wall:.3f}s; refused={by.get(p.pid, {}).get('refused')}; "
          f"spared={[(s['pid'], s['reason'][:50]) for s in doc['spared']]}; timings={doc['timings']}")
    assert code == 0 and doc["status"] == "clean", doc
    assert by[p.pid]["refused"] and "forward" in by[p.pid]["refused"]
    holder = next(pid for pid, t in by.items() if t["role"] == "holder")
    monitor = next(s["pid"] for s in doc["spared"] if "device handle" in s["reason"])
    assert gone(holder) and not gone(monitor) and not gone(p.pid)
    assert wall < 8  # the holder died of SIGTERM: nobody waited out the grace


def test_namespace_init_with_another_users_process_inside_is_refused(started, tmp_path):
    """One job (one process group): a CUDA holder, and `unshare --fork --pid` whose namespace holds
    another user's process. CUDA does not start inside a new PID namespace on every host, so the
    holder runs beside it. clear --pid of the job ends the holder; the namespace's init, whose death
    would end the other user's process, is refused."""
    if subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True).returncode != 0:
        pytest.skip("unshare --pid is not permitted here")
    ready = tmp_path / "ready"
    (tmp_path / "holder.py").write_text(HOLDER)
    inner = "setpriv --reuid=65534 --regid=65534 --clear-groups sleep 600 & wait"
    outer = (f"{sys.executable} {tmp_path / 'holder.py'} {4 * GiB} >> {ready} & "
             f"unshare --fork --pid bash -c {json.dumps(inner)} & wait")
    p = subprocess.Popen(["bash", "-c", outer], start_new_session=True, stdin=subprocess.DEVNULL)
    started.append(Started(p))  # type: ignore[arg-type]
    wait_ready(ready, 1)
    deadline = time.monotonic() + 10
    init = None
    while init is None and time.monotonic() < deadline:
        wrappers = [c for c in children(p.pid) if Path(f"/proc/{c}/comm").read_text().strip() == "unshare"]
        inits = children(wrappers[0]) if wrappers else []
        init = inits[0] if inits and children(inits[0]) else None
        time.sleep(0.02)
    assert init is not None
    stranger = children(init)[0]
    code, doc = clear("--gpus", "0", "--pid", str(p.pid), "--grace", "10")
    by = {t["pid"]: t for t in doc["targets"]}
    print(f"\nnamespace: exit {code}; refused={by.get(init, {}).get('refused')}; timings={doc['timings']}")
    assert code == 0 and doc["status"] == "clean", doc
    assert by[init]["refused"] and "namespace" in by[init]["refused"]
    holder = next(pid for pid, t in by.items() if t["role"] == "holder")
    assert gone(holder) and not gone(init) and not gone(stranger)
