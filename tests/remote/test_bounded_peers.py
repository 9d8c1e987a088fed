"""Bounded peers (issue 25): what a host sends over ssh is held to a byte limit, a depth limit and a
time limit; a host past any of them is that host's failure with a one-line reason (2 bad_document,
3 stalled; 7 in a fleet with a good host), never a hang, a traceback or unbounded memory.

Real sshd processes on loopback whose ``gpuslate`` is a fake on the login PATH, each one shape: a
document without end, one nested 200,000 deep, 200 MB, ``null``, invalid UTF-8, a 5,000-digit number,
``1e999``, a valid prefix and then nothing, whitespace trickled forever, stderr without end. Fakes end
themselves when their reader goes (or after a minute): nothing is left running on the machine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuslate.errors import BadDocument, HostStalled
from gpuslate.remote.host import RemoteHost
from gpuslate.remote.ssh import SshOptions
from sshd_hosts import SshLab, sshd_available, start_lab

pytestmark = [pytest.mark.ssh, pytest.mark.slow]  # real sshd processes, each answer ended by its bound

PRELUDE = textwrap.dedent("""\
    import os, select, sys, time
    out = sys.stdout.buffer
    def until_reader_gone(seconds=60):
        p = select.poll()
        p.register(1, select.POLLERR)
        p.poll(seconds * 1000)
    PREFIX = b'{"schema": "gpuslate.status.v1", "gpus": ['
""")
SHAPES = {
    "endless": "out.write(PREFIX)\nwhile True:\n    out.write(b'{\"index\": 0}, ' * 4096)\n",
    "deep": "out.write(b'[' * 200000 + b']' * 200000)\n",
    "big": ("out.write(b'{\"schema\": \"gpuslate.status.v1\", \"pad\": \"')\n"
            "for _ in range(200):\n    out.write(b'x' * (1 << 20))\nout.write(b'\"}')\n"),
    "null": "out.write(b'null\\n')\n",
    "badutf8": "out.write(b'{\"schema\": \"gpuslate.status.v1\", \"hostname\": \"\\xff\\xfe\"}\\n')\n",
    "hugeint": "out.write(b'{\"schema\": \"gpuslate.status.v1\", \"gpus\": [{\"index\": 1' + b'0' * 5000 + b'}]}')\n",
    "inf": "out.write(b'{\"schema\": \"gpuslate.status.v1\", \"taken_at\": 1e999}')\n",
    "stall": "out.write(PREFIX)\nout.flush()\nuntil_reader_gone()\n",
    "trickle": ("out.write(PREFIX)\nt = time.monotonic()\nwhile time.monotonic() - t < 60:\n"
                "    out.write(b' ')\n    out.flush()\n    time.sleep(0.05)\n"),
    "stderr": ("t = time.monotonic()\nwhile time.monotonic() - t < 60:\n"
               "    sys.stderr.buffer.write(b'e' * 65536)\n"),
}
BAD = ("endless", "deep", "big", "null", "badutf8", "hugeint", "inf")
SLOW = ("stall", "trickle", "stderr")
MARGIN = "2"  # GPUSLATE_ANSWER_MARGIN: the answer limit of a status is --connect-timeout 2 + 2 s


@pytest.fixture(scope="module")
def peers() -> Iterator[SshLab]:
    if not sshd_available():
        if os.environ.get("CI"):
            pytest.fail("no sshd")
        pytest.skip("no /usr/sbin/sshd or ssh client")
    base = Path(tempfile.mkdtemp(prefix="gsb-", dir="/tmp"))
    fakes = {}
    for name, body in SHAPES.items():
        d = base / f"fake-{name}"
        d.mkdir()
        (d / "gpuslate").write_text(f"#!{sys.executable}\n{PRELUDE}{body}out.flush()\n")
        (d / "gpuslate").chmod(0o755)
        fakes[name] = d
    lab = start_lab(base / "lab", ["good", *SHAPES], missing=tuple(SHAPES), extra_path=fakes)
    try:
        yield lab
    finally:
        lab.stop()
        shutil.rmtree(base, ignore_errors=True)


def gs(lab: SshLab, *args: str, timeout: float = 60, measure: bool = False) -> subprocess.CompletedProcess[str]:
    env = dict(lab.client_env(), GPUSLATE_ANSWER_MARGIN=MARGIN)
    argv = [sys.executable, "-m", "gpuslate", "--connect-timeout", "2", *args]
    if measure:  # the peak memory of the local gpuslate and its ssh, on the last line of stdout
        argv = [sys.executable, "-c", "import resource, subprocess, sys; subprocess.run(sys.argv[1:]); "
                "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)", *argv]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, cwd=str(lab.base),
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("shape", [*BAD, "stall"])
def test_one_host_past_a_bound_fails_with_one_line(peers, shape):
    t0 = time.monotonic()
    r = gs(peers, "-H", shape, "status")
    took = time.monotonic() - t0
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    assert r.returncode == (2 if shape in BAD else 3), (r.stdout[-500:], r.stderr[-500:])
    code = "bad_document" if shape in BAD else "stalled"
    errors = [ln for ln in r.stdout.splitlines() if ln.startswith(f"error ({code}):")]
    assert len(errors) == 1 and len(errors[0]) < 400, r.stdout[-2000:]
    assert took < 30, took  # the limit, not a hang (status: 2 s to connect + 2 s margin)


def test_a_fleet_with_broken_peers_is_partial(peers):
    """Every shape at once beside a good host (in parallel: one wait for the time limit)."""
    t0 = time.monotonic()
    r = gs(peers, *[w for name in ("good", *SHAPES) for w in ("-H", name)], "status", "--json")
    assert r.returncode == 7, r.stderr
    assert time.monotonic() - t0 < 30
    hosts = {h["host"]: h for h in json.loads(r.stdout)["hosts"]}
    assert hosts["good"]["ok"] and hosts["good"]["result"]["schema"] == "gpuslate.status.v1"
    assert {n: (h["error"]["type"], h["exit_code"]) for n, h in hosts.items() if n != "good"} == {
        **dict.fromkeys(BAD, ("bad_document", 2)), **dict.fromkeys(SLOW, ("stalled", 3))}


def test_a_200_mb_document_costs_no_200_mb(peers):
    r = gs(peers, "-H", "big", "status", measure=True)
    peak_kib = int(r.stdout.strip().splitlines()[-1])
    assert "more than 16777216 bytes" in r.stdout, r.stdout[-500:]
    assert peak_kib < 160 * 1024, peak_kib  # the 16 MiB limit and the interpreter, not 615 MiB


def test_the_library_raises_the_named_failure(peers):
    opts = SshOptions(connect_timeout=2, config=str(peers.ssh_config), control_dir=str(peers.control_dir))
    with pytest.raises(BadDocument, match="nested deeper than 64 levels"):
        RemoteHost("deep", ssh=opts).status()
    t0 = time.monotonic()
    with pytest.raises(HostStalled, match="no complete answer within 3 s"):
        RemoteHost("stall", ssh=opts, timeout=3).status()
    assert time.monotonic() - t0 < 15


def test_a_bad_margin_is_a_usage_error_before_any_host(peers):
    env = dict(peers.client_env(), GPUSLATE_ANSWER_MARGIN="soon")
    r = subprocess.run([sys.executable, "-m", "gpuslate", "-H", "stall", "status"], capture_output=True, text=True,
                       env=env, timeout=30, stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and "GPUSLATE_ANSWER_MARGIN" in r.stderr and "Traceback" not in r.stderr
