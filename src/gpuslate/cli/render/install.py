"""The output of ``install``, here (``--out``) or from another host's document (see :mod:`.results`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .plain import safe

if TYPE_CHECKING:
    from ...remote.zipapp import InstallResult


def show_install(result: InstallResult) -> None:
    """``install``'s result: the zipapp written here (--out), or, from a host's document, where it went
    there, which Python runs it, and what to set when the fleet will not find it."""
    from ...remote.zipapp import InstallStatus  # lazy: startup

    if result.status == InstallStatus.WRITTEN:
        print(f"wrote {safe(result.pyz)} (gpuslate {safe(result.version)}, {result.bytes / 1e6:.1f} MB, "
              f"sha256 {safe(result.sha256[:16])}); run it with: python3 {safe(result.pyz)}")
        return
    print(f"  installed gpuslate {safe(result.version)} at {safe(result.launcher)} "
          f"(Python {safe(result.python_version)}: {safe(result.python)}; status: {safe(result.status_check)})")
    for w in result.warnings:
        print(f"  warning: {safe(w)}")
    if result.remote_command:
        print(f"  not where --host looks: set GPUSLATE_REMOTE_COMMAND={safe(result.remote_command)} here")
