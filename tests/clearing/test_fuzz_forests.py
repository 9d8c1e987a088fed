"""The real-process fuzzer for ``clear`` (issue 15): random forests of real processes, random
selectors, and the invariants of docs/clear.md checked from liveness and the audit log.

Everything runs inside a private PID and mount namespace (``unshare --fork --pid --mount-proc``,
like a container), so every process a forest starts is ended with the namespace, pids are small
and can be reused on purpose, and ``clear`` can only ever reach the fuzzer's own processes. The
forests, the selections and the checks are in tests/fuzzkit/ (its package doc says how).

Parameters: ``GPUSLATE_FUZZ_SEED`` (default: a new seed each run, printed on failure) and
``GPUSLATE_FUZZ_FORESTS`` (default 150, and 20 for the PID 2 test); ``GPUSLATE_FUZZ_RESULTS=FILE``
keeps every forest's record (selection, plan, violations, tree) as JSON lines (``FILE.pid2`` for the second test).
Forest ``i`` has the seed ``SEED + i``; a failure prints the forest's seed, the one-line command that
replays it, and the forest as a tree.

Needs root (to create a PID namespace and a second user); fails in CI (``CI=true``) without it.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import SRC, per_worker, throwaway_user

pytestmark = pytest.mark.slow  # the whole file: 170 random forests of real processes (about 2 minutes)

USER = per_worker("gpuslate-fuzz")
DRIVER = str(Path(__file__).resolve().parents[1] / "fuzzkit" / "driver.py")
#: where a gpuslate that wrote outside its state folder would have written
CANARIES = [Path.home() / ".local" / "state" / "gpuslate", Path("/run/lock/gpuslate"),
            Path(tempfile.gettempdir()) / "gpuslate-locks"]


def _unavailable(why: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"the fuzzer cannot run in CI: {why}")
    pytest.skip(why)


@pytest.fixture(scope="module")
def fuzz_user() -> Iterator[pwd.struct_passwd]:
    """A second user for the forests' other-user processes; removed afterwards."""
    if os.geteuid() != 0:
        _unavailable("needs root (a PID namespace, a second user)")
    for tool in ("unshare", "useradd", "userdel", "runuser", "setpriv"):
        if not shutil.which(tool):
            _unavailable(f"{tool} is not installed")
    with throwaway_user(USER) as user:
        python = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable  # as the driver
        probe = subprocess.run([python, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import gpuslate", SRC],
                               user=user.pw_uid, group=user.pw_gid, extra_groups=[], capture_output=True, text=True,
                               cwd="/")
        if probe.returncode != 0:
            _unavailable(f"{USER} cannot run gpuslate from {SRC}: {probe.stderr.strip()[-200:]}")
        yield user


def _canary_state() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for root in CANARIES:
        if root.exists():
            out[str(root)] = sorted((str(p), p.lstat().st_mtime) for p in root.rglob("*"))
    return out


def run_fuzzer(user: pwd.struct_passwd, *, default_forests: int, driver_pid2: bool = False) -> list[dict]:
    seed = int(os.environ.get("GPUSLATE_FUZZ_SEED") or time.time_ns() % 1_000_000_000)
    forests = int(os.environ.get("GPUSLATE_FUZZ_FORESTS") or default_forests)
    base = Path(tempfile.mkdtemp(prefix="gpuslate-fuzz-"))
    base.chmod(0o755)  # the second user's processes read the run file and the simulated host
    canaries = _canary_state()
    try:
        cmd = ["unshare", "--fork", "--pid", "--mount-proc", "--kill-child", sys.executable, DRIVER,
               "--seed", str(seed), "--forests", str(forests), "--out", str(base),
               "--other", f"{user.pw_name}:{user.pw_uid}:{user.pw_gid}"]
        if driver_pid2:
            cmd.append("--driver-pid2")
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSLATE_")}
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
        assert p.returncode == 0, f"the fuzzer's driver failed (seed {seed}): {p.stderr[-3000:]}"
        text = (base / "results.jsonl").read_text()
        if os.environ.get("GPUSLATE_FUZZ_RESULTS"):  # every forest's record, for a closer look
            Path(f"{os.environ['GPUSLATE_FUZZ_RESULTS']}{'.pid2' if driver_pid2 else ''}").write_text(text)
        results = [json.loads(line) for line in text.splitlines()]
        assert len(results) == forests, p.stderr[-3000:]
        # what the run keeps for itself: the records, the init's log of what it reaped, the daemons' programs
        leftovers = sorted(str(x) for x in base.iterdir() if x.name not in ("results.jsonl", "reaped.log", "programs"))
        # the forests that broke an invariant first: a folder left behind is the lesser news
        assert not leftovers, f"forest folders left behind: {leftovers}\n{report(results, 'test_fuzz_forests')}"
    finally:
        shutil.rmtree(base, ignore_errors=True)
    assert _canary_state() == canaries, "gpuslate wrote outside the state and simulated-host folders"
    return results


def report(results: list[dict], test: str) -> str:
    """Failing forests, grouped by invariant: each with its seed, replay command and tree."""
    by_class: dict[str, list[dict]] = defaultdict(list)
    for r in results:
        for v in r["violations"]:
            by_class[v["cls"]].append(r)
    lines = [f"{sum(1 for r in results if r['violations'])} of {len(results)} forests broke an invariant: "
             + ", ".join(f"{c} ({len({r['seed'] for r in rs})} forests)" for c, rs in sorted(by_class.items()))]
    shown: set[int] = set()
    for _cls, rs in sorted(by_class.items()):
        for r in rs[:2]:  # two examples a class is enough to read; every seed replays
            if r["seed"] in shown:
                continue
            shown.add(r["seed"])
            lines += ["", f"== seed {r['seed']} ({'CLI' if r['cli'] else 'library'}): "
                          f"replay: GPUSLATE_FUZZ_SEED={r['seed']} GPUSLATE_FUZZ_FORESTS=1 "
                          f"python -m pytest -q -p no:cacheprovider tests/clearing/test_fuzz_forests.py::{test}",
                      f"selection: {json.dumps(r.get('selection'))}"]
            lines += [f"  {v['cls']}: {v['msg']}" for v in r["violations"]]
            if r.get("reuse"):
                lines.append(f"  pid reuse between plan and act: {r['reuse']}")
            lines += ["forest:", r.get("description") or "(not described)"]
    return "\n".join(lines)


@pytest.mark.timeout(600)
def test_fuzz_forests(fuzz_user):
    """150 forests (by default; GPUSLATE_FUZZ_FORESTS=N for more): every invariant holds on each."""
    results = run_fuzzer(fuzz_user, default_forests=150)
    assert not any(r["violations"] for r in results), report(results, "test_fuzz_forests")


@pytest.mark.timeout(600)
def test_fuzz_forests_caller_is_pid_2(fuzz_user):
    """The caller is PID 2 of its namespace, under an init, like a container's entry point under
    tini: it and everything it starts are ordinary processes, not kernel threads."""
    results = run_fuzzer(fuzz_user, default_forests=20, driver_pid2=True)
    assert not any(r["violations"] for r in results), report(results, "test_fuzz_forests_caller_is_pid_2")
