"""A wait shown in place on a terminal, as ``docker compose up`` shows its containers starting.

``up`` and ``swap`` (a server loading, for up to ``--start-timeout``, 900 s by default), ``down``,
``clear`` and ``wait`` (GPU memory still held) tell their host context's progress sink what they
wait for (:class:`~gpuslate.host.session.Progress`); here it becomes one line on stderr, redrawn
in place: the task, the time spent of the most it may take, and the latest news (the server's
last log line, the memory still held). Progress lines (``gpuslate: SIGTERM sent ...``) print
above it. Only on a terminal and without ``--json``: piped, nothing extra is written, and
stdout (the result) is never touched. Plain text, no rich: ``clear`` and ``wait`` start light.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import IO, TYPE_CHECKING

from ..commands.common import note
from .plain import clean, cut, paint, use_color, width_of

if TYPE_CHECKING:
    from ...host.session import Progress

_SPIN = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


def _seconds(s: float) -> str:
    return f"{s:.1f}s" if s < 60 else f"{int(s) // 60}m{int(s) % 60:02d}s"


def progress_text(p: Progress, width: int) -> str:
    """One line of at most ``width`` - 1 characters (the last column would wrap on some
    terminals): ``⠹ baseline: waiting until ready (sglang) 12.3s of 900s  loading weights ...``."""
    spin = _SPIN[int(p.elapsed_s * 8) % len(_SPIN)]
    limit = f" of {_seconds(p.limit_s)}" if p.limit_s is not None else ""
    head = f"{spin} {clean(p.task)} {_seconds(p.elapsed_s)}{limit}"
    detail = clean(p.detail)
    return cut(f"{head}  {detail}" if detail else head, max(10, width - 1))


class LiveLine:
    """The line of the wait under way, on ``out`` (stderr) when it is a terminal; else nothing."""

    def __init__(self, enabled: bool, out: IO[str] | None = None) -> None:
        self.out = out or sys.stderr
        self.enabled = enabled
        self.shown = False
        self.color = use_color(self.out)

    @classmethod
    def of(cls, args: argparse.Namespace) -> LiveLine:
        """For a command's arguments: on when stderr is a terminal (not dumb) and without --json."""
        return cls(sys.stderr.isatty() and not getattr(args, "json", False) and os.environ.get("TERM") != "dumb")

    @property
    def sink(self) -> Callable[[Progress], None] | None:
        """The progress sink to give a host context: None when nothing is shown (the library then
        makes no news at all)."""
        return self.progress if self.enabled else None

    def note(self, msg: str) -> None:
        """A progress line above the live one."""
        self._erase()
        note(msg)

    def progress(self, p: Progress) -> None:
        if not self.enabled:
            return
        if p.done:
            self._erase()
            return
        text = progress_text(p, width_of(self.out) or 80)
        self.out.write("\r\x1b[K" + paint(text, ("dim",), self.color))
        self.out.flush()
        self.shown = True

    def _erase(self) -> None:
        if self.shown:
            self.out.write("\r\x1b[K")
            self.out.flush()
            self.shown = False

    def __enter__(self) -> LiveLine:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._erase()
        except (OSError, ValueError):  # the terminal is gone
            pass
