"""TOML files (gpuslate.toml, experiment specs): reading them, and where things are in them.

``tomllib`` parses without positions, so a value rejected after parsing is
found again in the text for a FILE:LINE message: best effort, and 1 when unsure.
"""

from __future__ import annotations

import os
import re
from typing import Any

from .errors import UsageError


def read_toml(path: str | os.PathLike[str], what: str) -> tuple[str, dict[str, Any]]:
    """(text, document) of a TOML file; a UsageError naming ``what`` when it is missing,
    unreadable or malformed (tomllib's message already says the line and column)."""
    try:
        import tomllib  # type: ignore[import-not-found]
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise UsageError(f"{what} {path} not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None
    try:
        return text, tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: malformed TOML: {exc}") from None


def line_of(text: str, table: str | None, key: str | None) -> int:
    """Line (1-based) of ``key`` in ``[table]`` (or of the table's header, or of a top-level key); 1 if unsure."""
    lines = text.splitlines()
    start = -1
    if table is not None:
        want = _norm(table)
        start = next((i for i, ln in enumerate(lines)
                      if ln.lstrip().startswith("[") and _norm(ln.strip().split("#")[0]) == want), -1)
        if start < 0:
            # an inline table or dotted key at top level: `table = {...}` / `table.key = ...`
            return line_of(text, None, table.split(".")[0])
        if key is None:
            return start + 1
    pat = re.compile(r"\s*[\"']?" + re.escape(key or "") + r"[\"']?\s*[=.]")
    for i in range(start + 1, len(lines)):
        if lines[i].lstrip().startswith("["):
            if table is not None:
                break
            continue
        if pat.match(lines[i]):
            return i + 1
    if table is None and key is not None:  # a top-level table header `[key]` or `[key.x]`
        hdr = re.compile(r"\s*\[+\s*[\"']?" + re.escape(key) + r"[\"']?\s*[\].]")
        return next((i + 1 for i, ln in enumerate(lines) if hdr.match(ln)), 1)
    return max(start + 1, 1)


def _norm(header: str) -> str:
    return re.sub(r"[\s\"'\[\]]", "", header)
