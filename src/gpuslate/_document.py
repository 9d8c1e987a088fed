"""Reading result documents back into result objects: every ``to_json`` has a ``from_json``.

The versioned ``--json`` document of a command is the contract between a remote
gpuslate and the local one (``--host``): the local side rebuilds the very result
type the command returns, and renders it with the same renderer as a local run.
``X.from_json(doc).to_json() == doc`` holds for every document gpuslate writes.

A document of another schema or version, or one that is malformed, raises
:class:`~gpuslate.errors.BadDocument`; nothing is guessed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .errors import BadDocument


def checked(doc: object, schema: str) -> dict[str, Any]:
    """``doc`` when it is a ``schema`` document (name and version); else BadDocument."""
    if not isinstance(doc, dict):
        raise BadDocument(f"not a {schema} document: a JSON {type(doc).__name__}, not an object")
    found = doc.get("schema")
    if found != schema:
        raise BadDocument(f"not a {schema} document: its schema is {found!r}")
    return doc


@contextmanager
def reading(schema: str) -> Iterator[None]:
    """Turn a missing key or a value of the wrong type met while reading into one BadDocument."""
    try:
        yield
    except BadDocument:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise BadDocument(f"malformed {schema} document: {type(exc).__name__}: {exc}") from None

