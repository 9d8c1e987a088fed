"""Where gpuslate keeps per-user state (the audit log): one private folder per user."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import PermissionDenied


def state_dir() -> Path:
    """``$GPUSLATE_STATE_DIR``, else ``$XDG_STATE_HOME/gpuslate``, else ``~/.local/state/gpuslate``.

    Created with mode 0700 on first use; an existing folder is left as it is.
    """
    path = _configured_dir()
    try:
        path.mkdir(mode=0o700, parents=True)
        # mkdir's mode goes through the umask; an odd umask must not lock us out
        os.chmod(path, 0o700)
    except FileExistsError:
        if not path.is_dir():
            raise PermissionDenied(f"cannot use state directory {path}: it exists and is not a directory") from None
    except OSError as exc:
        raise PermissionDenied(f"cannot create state directory {path}: {exc.strerror or exc}",
                               hint="set GPUSLATE_STATE_DIR to a writable directory") from None
    return path


def _configured_dir() -> Path:
    env = os.environ.get("GPUSLATE_STATE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME")
    # the XDG spec says a relative value is invalid and must be ignored
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "gpuslate"
    try:
        home = Path.home()
    except (RuntimeError, KeyError):  # no $HOME and no passwd entry (some containers)
        raise PermissionDenied("cannot find a home directory for the gpuslate state directory",
                               hint="set GPUSLATE_STATE_DIR to a writable directory") from None
    return home / ".local" / "state" / "gpuslate"
