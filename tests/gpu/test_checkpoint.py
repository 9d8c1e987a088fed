"""The cuda-core choke point without a GPU: a missing ``park`` extra is one line with its install command,
cuda-core's failures become typed errors carrying the driver's error name, and nothing else imports it.

(The calls themselves, on a real GPU: test_checkpoint_real.py, marked ``gpu``.)
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpuslate.errors import BackendUnavailable, CheckpointError, UsageError
from gpuslate.gpu import checkpoint as ckpt
from helpers import gpuslate_env


def test_a_missing_park_extra_names_its_install_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cuda.core", None)  # as where the extra is not installed
    with pytest.raises(UsageError) as info:
        ckpt.CudaCheckpoint().state(1234)
    assert "cuda.core" in info.value.message and "not installed" in info.value.message
    assert info.value.hint is not None and "[park]" in info.value.hint


@pytest.mark.parametrize(("text", "code"), [
    ("CUDA_ERROR_ILLEGAL_STATE: operation not permitted in this state", "CUDA_ERROR_ILLEGAL_STATE"),
    ("checkpoint failed: CUDA_ERROR_NOT_SUPPORTED", "CUDA_ERROR_NOT_SUPPORTED"),
    ("CUDA checkpointing is not supported by the installed NVIDIA driver. Upgrade to a driver version with CUDA "
     "checkpoint API support.", "CUDA_ERROR_NOT_SUPPORTED"),
    ("something nobody expected", "CUDA_ERROR_UNKNOWN"),
])
def test_cuda_core_errors_become_checkpoint_errors_with_the_drivers_name(text: str, code: str) -> None:
    err = ckpt._error(RuntimeError(text), 42, "lock")
    assert isinstance(err, CheckpointError) and err.driver_code == code and err.pid == 42
    assert err.message.startswith("lock of pid 42: ")


def test_a_missing_driver_library_is_no_backend() -> None:
    class DynamicLibNotFoundError(RuntimeError):  # cuda.pathfinder's, by name: a host without a driver
        pass

    err = ckpt._error(DynamicLibNotFoundError('"cuda" is an NVIDIA driver library ...'), 7, "state")
    assert isinstance(err, BackendUnavailable)


def test_status_never_imports_cuda_core(tmp_path) -> None:
    """The checkpoint API costs 0.4 s to import: only a park may pay it."""
    code = ("import sys, json\nfrom gpuslate.cli.main import main\nmain(['--sim', sys.argv[1], 'status', '--json'])\n"
            "print([m for m in sys.modules if m.startswith('cuda')], file=sys.stderr)")
    subprocess.run([sys.executable, "-m", "gpuslate", "sim", "init", str(tmp_path / "h"), "--count", "1"],
                   env=gpuslate_env(), check=True, capture_output=True)
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "h")], env=gpuslate_env(), capture_output=True,
                       text=True, timeout=60)
    assert r.stderr.strip().splitlines()[-1] == "[]", r.stderr
