"""``--tokenizer NAME_OR_PATH``: count generated tokens exactly when the server reports no usage.

vLLM's ``bench serve`` re-tokenizes the generated text with the model's
tokenizer; so does this, with the ``tokenizers`` library (the optional
``tokenizers`` extra) and local files only: a ``tokenizer.json`` file, a
folder holding one, or a Hugging Face model name already in the local cache
(``$HF_HOME/hub``). Nothing is downloaded. Without a tokenizer and without
usage the counts are estimates and the figures say so.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

from ..errors import UsageError
from ..extras import Extra, install_hint


class TokenCounter(Protocol):
    def count(self, text: str) -> int: ...


class HfTokenizer:
    """A ``tokenizers.Tokenizer`` counting tokens without special ones (as usage does)."""

    def __init__(self, path: Path) -> None:
        try:  # an optional dependency: imported only when --tokenizer is given
            from tokenizers import Tokenizer  # lazy: optional
        except ImportError:
            raise UsageError("--tokenizer needs the tokenizers library", hint=install_hint(Extra.TOKENIZERS)) from None
        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # noqa: BLE001 - the library raises its own Exception subclass for bad files
            raise UsageError(f"--tokenizer {path}: not a tokenizer.json: {' '.join(str(exc).split())[:200]}") from None
        self.path = path

    def count(self, text: str) -> int:
        if not text:
            return 0
        return len(self._tok.encode(text, add_special_tokens=False).ids)


def _hf_cache_file(name: str) -> Path | None:
    home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    hub = Path(os.environ.get("HF_HUB_CACHE") or home / "hub")
    snapshots = hub / ("models--" + name.replace("/", "--")) / "snapshots"
    if not snapshots.is_dir():
        return None
    found = sorted(snapshots.glob("*/tokenizer.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    return found[0] if found else None


def resolve_tokenizer_file(name_or_path: str) -> Path:
    """The ``tokenizer.json`` that NAME_OR_PATH means; UsageError when there is none locally."""
    p = Path(name_or_path).expanduser()
    if p.is_file():
        return p
    if p.is_dir():
        if (p / "tokenizer.json").is_file():
            return p / "tokenizer.json"
        raise UsageError(f"--tokenizer {name_or_path}: the folder holds no tokenizer.json")
    cached = _hf_cache_file(name_or_path) if "/" in name_or_path or not p.suffix else None
    if cached is not None:
        return cached
    raise UsageError(f"--tokenizer {name_or_path}: no such file, folder, or model in the local "
                     "Hugging Face cache (nothing is downloaded)")


def load_tokenizer(name_or_path: str) -> HfTokenizer:
    return HfTokenizer(resolve_tokenizer_file(name_or_path))
