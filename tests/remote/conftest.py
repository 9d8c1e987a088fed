"""Fixtures for the remote tests: real sshd processes on loopback, each its own simulated host.

One session-wide lab (starting sshd and generating keys costs about a second):
``h1`` and ``h2`` run this checkout's gpuslate; ``refused`` accepts no key;
``bare`` has no gpuslate but a fake ``nvidia-smi`` printing CSV; ``down`` is a
closed port; ``rekeyed`` is h1 with another key in known_hosts; ``hang`` is a
TCP listener that never speaks. In CI (``CI=true``) a missing sshd fails these
tests instead of skipping them.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuslate.gpu.simhost.host import SimHost
from helpers import GiB
from sshd_hosts import SshLab, free_port, sshd_available, start_lab

FAKE_SMI = """#!/bin/sh
# a stand-in for nvidia-smi on a host without gpuslate: fixed CSV, like the real one prints
case "$1" in
  --query-gpu=*)
    echo "0, GPU-aaaa, NVIDIA H200, 1024, 143771, 3, 31, 75.20, 700.00, P0, 580.95.05"
    echo "1, GPU-bbbb, NVIDIA H200, 0, 143771, 0, 29, 74.10, 700.00, P0, 580.95.05" ;;
  --query-compute-apps=*)
    echo "GPU-aaaa, 4242, 1000, python3" ;;
  *) exit 9 ;;
esac
"""


@pytest.fixture(scope="session")
def ssh_lab() -> Iterator[SshLab]:
    if not sshd_available():
        msg = "no /usr/sbin/sshd or ssh client: apt-get install openssh-server openssh-client"
        if os.environ.get("CI"):
            pytest.fail(msg)  # CI installs it (.ci/run): these tests must run there
        pytest.skip(msg)
    # a short base path: ssh control sockets must fit in 108 bytes
    base = Path(tempfile.mkdtemp(prefix="gsl-", dir="/tmp"))
    smi = base / "smi"
    smi.mkdir()
    (smi / "nvidia-smi").write_text(FAKE_SMI)
    (smi / "nvidia-smi").chmod(0o755)
    lab = start_lab(base / "lab", ["h1", "h2", "refused", "bare"], missing=("bare",), refuse=("refused",),
                    extra_path={"bare": smi})
    lab.add_alias("down", free_port())  # nothing listens there
    lab.add_rekeyed_alias("rekeyed", lab.hosts["h1"].port)  # h1, but known_hosts remembers another key
    hang = socket.socket()
    hang.bind(("127.0.0.1", 0))
    hang.listen(64)  # the kernel accepts; nobody ever sends the SSH banner
    lab.add_alias("hang", hang.getsockname()[1])
    try:
        yield lab
    finally:
        hang.close()
        lab.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def lab(ssh_lab: SshLab) -> Iterator[SshLab]:
    """The lab with h1/h2's simulated hosts reset (holders of earlier tests are gone)."""
    for name in ("h1", "h2"):
        h = ssh_lab.hosts[name]
        h.sim = SimHost.init(h.root / "sim", gpus=4, memory=96 * GiB, name=name, release_delay=0.1)
    yield ssh_lab


@pytest.fixture
def fleet(lab: SshLab) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run the local gpuslate (this checkout) with the lab's ssh configuration."""

    def run(*args: str, timeout: float = 90, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gpuslate", *args], capture_output=True, text=True,
                              env=lab.client_env(), timeout=timeout, input=input, cwd=str(lab.base))

    return run
