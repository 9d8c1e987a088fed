"""Stand-ins named like an engine, so that its own command line runs gpuslate's simulated server.

An experiment (the demo's, a test's) declares its deployments exactly as on GPUs
(``python -m sglang.launch_server ...``, ``vllm serve ...``, ``trtllm-serve ...``);
on a machine without the engine, a stand-in of the engine's launch form (a
program on ``PATH``, or a Python package on ``PYTHONPATH``) replaces itself with
``gpuslate sim serve --emulate ENGINE -- ARGS``, which reads the arguments by the
engine's rules (docs/sim-server.md). The stand-ins are written into a folder of
the caller's; nothing outside it is touched.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from pathlib import Path


def write(folder: Path, form: Sequence[str], serve: Sequence[str]) -> dict[str, str]:
    """Write the stand-in of ``form`` (``("vllm", "serve")``, or ``("-m", "sglang.launch_server")``)
    into ``folder``, running ``serve`` (the ``sim serve --emulate`` command, without its ``--``) with
    the engine's arguments; returns the environment variables that put it first (PATH or
    PYTHONPATH, the current value kept after it)."""
    if list(form[:1]) == ["-m"]:
        parts = form[1].split(".")
        pkg = folder / "py"
        for part in parts[:-1]:
            pkg = pkg / part
            pkg.mkdir(parents=True, exist_ok=True)
            (pkg / "__init__.py").touch()
        (pkg / f"{parts[-1]}.py").write_text(
            "import os, sys\n"
            f"# a stand-in written by gpuslate: {' '.join(form[1:])} played by its simulated server\n"
            f"os.execv({str(serve[0])!r}, {list(serve)!r} + ['--', *sys.argv[1:]])\n")
        return {"PYTHONPATH": os.pathsep.join(filter(None, [str(folder / "py"), os.environ.get("PYTHONPATH")]))}
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    program = bin_dir / form[0]
    program.write_text(f"#!/bin/sh\n# a stand-in written by gpuslate: {form[0]} played by its simulated server\n"
                       f"exec {shlex.join(serve)} -- \"$@\"\n")
    program.chmod(0o755)
    return {"PATH": os.pathsep.join(filter(None, [str(bin_dir), os.environ.get("PATH")]))}
