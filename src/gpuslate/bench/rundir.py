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
import os
from pathlib import Path
from typing import Any

from ..errors import UsageError

RUN_SCHEMA = "gpuslate.experiment.run.v1"
POINT_SCHEMA = "gpuslate.experiment.point.v1"
VERIFY_SCHEMA = "gpuslate.experiment.verification.v1"
VERIFY_FILE = "verification.json"


def write_json_atomic(path: Path, doc: Any) -> None:
    """Whole or not at all: a temp file in the same folder, fsync, rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_run(out: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The run manifest and every finished point (unreadable or foreign files are skipped)."""
    manifest = out / "experiment.json"
    try:
        run = json.loads(manifest.read_text())
    except FileNotFoundError:
        raise UsageError(f"{out} is not an experiment folder (no experiment.json)") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {manifest}: {exc}") from None
    if not isinstance(run, dict):
        raise UsageError(f"cannot read {manifest}: not a JSON object")
    points = []
    for p in sorted((out / "points").glob("*.json")):
        try:
            doc = json.loads(p.read_text())
        except (OSError, ValueError):
            continue  # only atomic renames land here; anything else is not ours
        if isinstance(doc, dict) and doc.get("schema") == POINT_SCHEMA:
            points.append(doc)
    return run, points


def load_verification(out: Path) -> dict[str, Any] | None:
    """``DIR/verification.json`` if there is one of ours (None otherwise)."""
    try:
        doc = json.loads((out / VERIFY_FILE).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("schema") == VERIFY_SCHEMA else None
