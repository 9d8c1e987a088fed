"""Helpers for the unit tests: free ports, the simulated server as a unit command, the CLI."""

from __future__ import annotations

import socket
import subprocess
import sys

from helpers import gpuslate_env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_cmd(port: int, *extra: str, startup: float = 0.3, memory: str = "4GiB") -> list[str]:
    """`gpuslate sim serve` as a unit's command: one worker per visible GPU holding ``memory``."""
    return [sys.executable, "-m", "gpuslate", "sim", "serve", "--port", str(port),
            "--startup-seconds", str(startup), "--memory", memory, *extra]


def run_units(*args: str, timeout: float = 60, env: dict[str, str] | None = None,
              cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuslate", *args], capture_output=True, text=True,
                          env=gpuslate_env(env), timeout=timeout, cwd=cwd, stdin=subprocess.DEVNULL)


def popen_units(*args: str, cwd: str | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "gpuslate", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=gpuslate_env(), cwd=cwd, start_new_session=True)
