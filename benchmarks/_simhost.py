"""A simulated host for the benchmarks' ``--sim`` runs: no GPU needed, real holder processes.

``bench_status.py --sim N`` and ``bench_clear.py --sim N`` time gpuslate against a simulated host of
N GPUs in a temporary folder (``gpuslate sim init``), whose memory is held by ``gpuslate sim hold``
processes, each in its own session; ``--before DIR`` times a second gpuslate source tree (``git
archive OLD | tar -x -C DIR``) in the same interleaved rounds, so that one run gives the after/before
ratio on one machine under the same load. Every process signaled is one these scripts started: the
holders of the simulated host (``clear`` only ever targets what holds its GPUs).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class SimHost:
    """A simulated host in a temporary folder, and the source trees to time against it."""

    def __init__(self, gpus: int, *, release_delay: float = 0.2, before: str | None = None) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="gpuslate-bench-sim-"))
        self.root = str(self.tmp / "host")
        # bytecode cached, as after a pip install (the warm-up rounds write it): see RESULTS.md's set-ups
        base = {k: v for k, v in os.environ.items()
                if k not in ("GPUSLATE_SIM", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
        base.update(GPUSLATE_STATE_DIR=str(self.tmp / "state"), GPUSLATE_LOCK_DIR=str(self.tmp / "locks"),
                    GPUSLATE_SIM=self.root, PYTHONPYCACHEPREFIX=str(self.tmp / "pycache"))
        #: label -> the environment that runs that tree's gpuslate (``python -m gpuslate``)
        self.trees = {"after": {**base, "PYTHONPATH": str(ROOT / "src")}}
        if before:
            self.trees = {"before": {**base, "PYTHONPATH": str(Path(before) / "src")}, **self.trees}
        self.env = self.trees["after"]
        self.gpus, self.release_delay = gpus, release_delay
        subprocess.run([sys.executable, "-m", "gpuslate", "sim", "init", self.root, "--gpus", str(gpus),
                        "--memory", "96GiB", "--release-delay", str(release_delay)], env=self.env, check=True,
                       capture_output=True)
        self.holders: list[subprocess.Popen[str]] = []

    def hold(self, gpu: int, gib: float) -> int:
        """A ``sim hold`` process holding ``gib`` GiB of simulated GPU ``gpu``, in its own session, once ready."""
        p = subprocess.Popen([sys.executable, "-m", "gpuslate", "sim", "hold", "--gpus", str(gpu), "--memory",
                              f"{gib}GiB"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
                             env=self.env, start_new_session=True)
        self.holders.append(p)
        ready, _, _ = select.select([p.stdout], [], [], 60)
        if not ready or not p.stdout.readline():  # type: ignore[union-attr]
            raise RuntimeError("the simulated holder did not become ready")
        return p.pid

    def kill(self) -> None:
        """Every holder started, by its process group (each its own session), and reaped."""
        for p in self.holders:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        self.holders = []

    def command(self, *words: str) -> list[str]:
        return [sys.executable, "-m", "gpuslate", *words]
