"""Run SGLang's ``bench_serving`` (``sglang.benchmark.serving``) without torch.

SGLang installs here with ``pip install --no-deps sglang`` plus what the
benchmark client imports (aiohttp, numpy, requests, tqdm, transformers,
tokenizers, msgspec, orjson, pyzmq, psutil, pybase64, pillow), but
``sglang/__init__.py`` and ``sglang/srt/utils/__init__.py`` import torch and
triton for the server. The client needs neither: this launcher registers
those packages as bare namespace packages (their ``__init__`` not run) and
stubs the one constant the client takes from a torch-importing module, then
runs the unmodified client with the given arguments.

    python benchmarks/sglang_bench_serving.py --backend sglang-oai --base-url URL ...
"""

from __future__ import annotations

import importlib.util
import runpy
import sys
import types
from pathlib import Path


def _bare_package(name: str, path: Path) -> None:
    module = types.ModuleType(name)
    module.__path__ = [str(path)]  # type: ignore[attr-defined]
    sys.modules[name] = module


def main() -> None:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("sglang is not installed (pip install --no-deps sglang)")
    root = Path(list(spec.submodule_search_locations)[0])
    _bare_package("sglang", root)
    _bare_package("sglang.srt", root / "srt")
    _bare_package("sglang.srt.utils", root / "srt" / "utils")
    _bare_package("sglang.srt.disaggregation", root / "srt" / "disaggregation")
    stub = types.ModuleType("sglang.srt.disaggregation.utils")
    stub.FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # type: ignore[attr-defined]  # its value in SGLang
    sys.modules["sglang.srt.disaggregation.utils"] = stub
    if importlib.util.find_spec("datasets") is None:
        # Hugging Face `datasets` is imported for the MMMU dataset only (not used here).
        hf = types.ModuleType("datasets")

        def load_dataset(*args: object, **kwargs: object) -> None:
            raise RuntimeError("Hugging Face datasets is not installed")

        hf.load_dataset = load_dataset  # type: ignore[attr-defined]
        sys.modules["datasets"] = hf
    sys.argv[0] = "sglang.benchmark.serving"
    runpy.run_module("sglang.benchmark.serving", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
