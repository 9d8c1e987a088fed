"""Every command over ``--host`` prints what it prints on the host itself: the same renderer, fed the
same result (read back from its document), apart from the fleet's heading (and, for a failure, its
error line and summary). Each command runs locally against a simulated host, and through a real
sshd on loopback against the same host, with the same exit code.

Where the state is the same for both runs (status, clear --dry-run, wait, ps, logs, audit) the
outputs are compared byte for byte, timings and clock times aside; a command that changes the
host (clear, up, down, swap) runs twice on the same setup, and its outputs are compared with
their pids, timings and the column padding those change normalised.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Callable

import pytest

from helpers import gpuslate_env, is_gone, wait_for
from sshd_hosts import SshHost, free_port

pytestmark = pytest.mark.ssh

HEADING = "── h1 ──\n"
_CLOCK = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")
_SHARE = re.compile(r" *\b\d+%")
_FLOAT = re.compile(r"\d+\.\d+")
_PID = re.compile(r"\b\d{3,}\b")  # pids (GPU indexes and counts are shorter)
_COUNTS = re.compile(r"\d+ process(es)?|SIGTERM \d+, SIGKILL \d+")  # how many a stop found: varies by run


def _stable(text: str) -> str:
    """Without the clock, the timings and the shares (a process's CPU share over its life: they
    differ between two runs of the same thing)."""
    return _SHARE.sub(" P%", _FLOAT.sub("F", _CLOCK.sub("TIME", text)))


def _shape(text: str) -> str:
    """Without pids and process counts either, and without the padding their widths change."""
    text = _COUNTS.sub("COUNT", _PID.sub("N", _stable(text)))
    return "\n".join(re.sub(r" +", " ", line).rstrip() for line in text.splitlines())


class Pair:
    """One command run here (against h1's simulated host) and over --host h1."""

    def __init__(self, host: SshHost, fleet: Callable[..., subprocess.CompletedProcess[str]]) -> None:
        self.host, self.fleet = host, fleet

    def local(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gpuslate", *args], capture_output=True, text=True,
                              env=gpuslate_env(self.host.env), timeout=90, check=False)

    def remote(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.fleet("-H", "h1", *args)


def _body(r: subprocess.CompletedProcess[str]) -> str:
    """What the fleet printed for the host, without its heading and, after a failure, its error
    line and summary."""
    assert r.stdout.startswith(HEADING), r.stdout + r.stderr
    body = r.stdout[len(HEADING):]
    if r.returncode != 0:
        cut = body.rfind("error (")
        assert cut >= 0, body
        body = body[:cut]
    return body


def _same(local: subprocess.CompletedProcess[str], remote: subprocess.CompletedProcess[str],
          norm: Callable[[str], str] = lambda t: t) -> None:
    assert local.returncode == remote.returncode, (local.stdout + local.stderr, remote.stdout + remote.stderr)
    assert local.stdout or local.returncode != 0, local.stderr
    assert norm(_body(remote)) == norm(local.stdout)
    if local.returncode != 0:  # the failure's story, on stderr (after the progress notes a local run writes)
        assert norm(remote.stderr).endswith(norm(_story(local.stderr))), (local.stderr, remote.stderr)


def _story(stderr: str) -> str:
    lines = stderr.splitlines(keepends=True)
    first = next((i for i, ln in enumerate(lines) if ln.startswith(("--- last", "gpuslate: error:"))), len(lines))
    return "".join(lines[first:])


@pytest.fixture
def pair(lab, fleet) -> Pair:
    return Pair(lab.hosts["h1"], fleet)


def test_reading_commands_print_the_same(pair, hold):
    h1 = pair.host
    held = hold("--memory", "3GiB", "--gpus", "0-1", "--workers", "2", "--orphan-workers",
                "--title", "sglang::scheduler_TP{rank}", host=h1.sim)
    hold("--memory", "0", "--gpus", "3", "--title", "my-monitor", host=h1.sim)  # spared: a handle only
    for args in (("status",), ("status", "--gpus", "0,3"), ("clear", "--dry-run"),
                 ("clear", "--dry-run", "--pid", str(held.pid)), ("wait", "--free", "--timeout", "0")):
        local, remote = pair.local(*args), pair.remote(*args)
        _same(local, remote, _stable)
        if args[0] == "status":  # the launcher holds no GPU: its command comes with the document
            assert "launcher" in local.stdout and "(holds no GPU itself)" not in local.stdout
    assert pair.local("wait", "--free", "--timeout", "0").returncode == 4
    assert pair.local("clear", "--yes", "--grace", "2").returncode == 0  # the audit log has entries now
    wait_for(lambda: is_gone(held.pid))
    for args in (("audit",), ("audit", "--limit", "2"), ("ps",), ("wait", "--free", "--timeout", "5")):
        _same(pair.local(*args), pair.remote(*args), _stable)


def test_clear_prints_the_same(pair, hold):
    outs = []
    for run in (pair.local, pair.remote):
        held = hold("--memory", "5GiB", "--gpus", "1-2", "--workers", "2", host=pair.host.sim)
        outs.append(run("clear", "--yes", "--grace", "2"))
        wait_for(lambda h=held: is_gone(h.pid))
    _same(*outs, _shape)
    assert "Clean: GPUs 0-3 free" in outs[0].stdout


def test_unit_commands_print_the_same(pair):
    port = str(free_port())
    serve = ["--", sys.executable, "-m", "gpuslate", "sim", "serve", "--port", port, "--startup-seconds", "0.1",
             "--memory", "2GiB"]
    up = ("up", "a", "--gpus", "0,1", "--port", port, "--engine", "sglang", "--smoke", *serve)
    bad = ("up", "bad", "--gpus", "3", "--start-timeout", "5", "--ready-log", "never", "--", sys.executable,
           "-c", "raise SystemExit(3)")
    def twice(args: tuple[str, ...], between: tuple[str, ...] | None) -> None:
        """ARGS here, then BETWEEN (here: the state back as it was), then ARGS over --host."""
        local = pair.local(*args)
        if between is not None:
            r = pair.local(*between)
            assert r.returncode == 0, r.stdout + r.stderr
        _same(local, pair.remote(*args), _shape)

    try:
        twice(up, ("down", "a"))
        for args in (("ps",), ("logs", "a")):
            twice(args, None)
        twice(("down", "a"), up)
        twice(("down", "a"), None)  # nothing left to stop
        twice(bad, None)  # exit 6, its story on stderr
        twice(("ps",), None)
        # 'b' is recorded by a first run, so that swap can start it again from its record
        assert pair.local("up", "b", "--gpus", "0,1", "--port", port, *serve, "--mode", "speculative").returncode == 0
        assert pair.local("down", "b").returncode == 0
        outs = []
        for run in (pair.local, pair.remote):
            assert pair.local(*up).returncode == 0
            outs.append(run("swap", "a", "b"))
            assert pair.local("down", "b").returncode == 0
        _same(*outs, _shape)
        assert "verify GPUs clean" in outs[0].stdout
    finally:
        for name in ("a", "b", "bad"):
            pair.local("down", name)
        shutil.rmtree(pair.host.state_dir / "units", ignore_errors=True)  # the next tests find h1 without units
