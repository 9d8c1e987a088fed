"""An experiment folder's files, shared by the run (:mod:`.experiment`) and the report (:mod:`.report`).

``DIR/experiment.json`` (the run manifest, ``gpuslate.experiment.run.v1``),
``DIR/points/*.json`` (one ``gpuslate.experiment.point.v1`` per finished point,
written whole or not at all) and ``DIR/verification.json`` (the recommendation's
own run, fixed when it starts so that a ``--resume`` runs the same one). Kept
apart so that the run may make the report's summary mid-run (to plan the
verification) without the two modules importing each other.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .._document import parse_json
from .._walk import read_file, write_file
from ..errors import UsageError

RUN_SCHEMA = "gpuslate.experiment.run.v1"
POINT_SCHEMA = "gpuslate.experiment.point.v1"
VERIFY_SCHEMA = "gpuslate.experiment.verification.v1"
VERIFY_FILE = "verification.json"


#: the largest file of an experiment folder that is read back (a point with every request's figures)
MAX_RESULT_BYTES = 256 << 20


def write_json_atomic(path: Path, doc: Any) -> None:
    """Whole or not at all: a temp file in the same folder, fsync, rename; the folder reached by
    the trusted-root walk (:func:`gpuslate._walk.write_file`: never through another user's link)."""
    write_file(path, (json.dumps(doc, indent=1) + "\n").encode(), sync=True, what="experiment directory")


def read_json(path: Path) -> Any:
    """A file of an experiment folder, read back by the walk (a regular file, never another user's
    link, at most :data:`MAX_RESULT_BYTES`) and parsed within :func:`gpuslate._document.parse_json`'s
    bounds. Raises OSError or ValueError (a BadDocument)."""
    return parse_json(read_file(path, limit=MAX_RESULT_BYTES, what="experiment file"), max_bytes=MAX_RESULT_BYTES)


def load_run(out: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The run manifest and every finished point (unreadable or foreign files are skipped)."""
    manifest = out / "experiment.json"
    try:
        run = read_json(manifest)
    except FileNotFoundError:
        raise UsageError(f"{out} is not an experiment folder (no experiment.json)") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {manifest}: {exc}") from None
    if not isinstance(run, dict):
        raise UsageError(f"cannot read {manifest}: not a JSON object")
    points = []
    for p in sorted((out / "points").glob("*.json")):
        try:
            doc = read_json(p)
        except (OSError, ValueError):
            continue  # only atomic renames land here; anything else is not ours
        if isinstance(doc, dict) and doc.get("schema") == POINT_SCHEMA:
            points.append(doc)
    return run, points


def load_verification(out: Path) -> dict[str, Any] | None:
    """``DIR/verification.json`` if there is one of ours (None otherwise)."""
    try:
        doc = read_json(out / VERIFY_FILE)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("schema") == VERIFY_SCHEMA else None
