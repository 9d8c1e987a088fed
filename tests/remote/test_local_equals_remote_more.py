"""The commands beyond the host verbs print over ``--host`` what they print on the host itself too:
``sim init``, ``sim leak``, ``experiment report`` and ``bench`` (against a ``sim serve`` this test
starts on loopback, reached by both runs), each run here against h1's simulated host and over
``--host h1`` (a real sshd on loopback), with the same exit code. See test_local_equals_remote.py
for the helpers and the host verbs."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from helpers import experiment_folder, gpuslate_env, wait_for
from sshd_hosts import free_port
from test_local_equals_remote import Pair, _same, _stable

pytestmark = pytest.mark.ssh

_NUMBER = re.compile(r"\d+(\.\d+)?")


def _numbers(text: str) -> str:
    """bench: every figure is a timing, and the columns are as wide as the figures; a figure that one
    run could not measure (``-``: e.g. no gap between two tokens seen, under load) is still a figure's place."""
    return "\n".join(re.sub(r" +", " ", re.sub(r"(?<!\S)-(?!\S)", "N", _NUMBER.sub("N", line))).rstrip()
                     for line in text.splitlines())


@pytest.fixture
def pair(lab, fleet) -> Pair:
    return Pair(lab.hosts["h1"], fleet)


def test_sim_and_experiment_commands_print_the_same(pair, tmp_path):
    h1 = pair.host
    folder = str(h1.root / "sim-made")
    for args in (("sim", "init", folder, "--count", "2", "--memory", "8GiB"),
                 ("sim", "leak", "--gpu", "1", "--memory", "1GiB"),
                 ("experiment", "report", str(experiment_folder(tmp_path)))):
        _same(pair.local(*args), pair.remote(*args), _stable)
    assert "Recommendation: speculation wins up to concurrency 1" in pair.local(*args).stdout
    bad = ("sim", "leak", "--gpu", "9", "--memory", "1GiB")  # no such GPU: no document, the same error and code
    local, remote = pair.local(*bad), pair.remote(*bad)
    assert local.returncode == remote.returncode == 2
    assert local.stderr.removeprefix("gpuslate: error: ").strip() in remote.stdout


def test_bench_prints_the_same(pair, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve = subprocess.Popen([sys.executable, "-m", "gpuslate", "sim", "serve", "--port", str(port),
                              "--startup-seconds", "0", "--time-scale", "20"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, env=gpuslate_env(), start_new_session=True)
    try:
        def ready() -> bool:
            return pair.local("bench", url, "-n", "1", "--output-len", "1", "--input-len", "1").returncode == 0

        wait_for(ready, timeout=30)
        args = ("bench", url, "-n", "3", "-c", "1,2", "--seed", "3", "--input-len", "8", "--output-len", "8")
        local, remote = pair.local(*args), pair.remote(*args)
        _same(local, remote, _numbers)
        assert "sim-model at" in local.stdout and "Conc" in local.stdout
    finally:
        serve.terminate()
        serve.wait(15)
