"""Interrupts around a unit's start: SIGTERM treated like Ctrl-C, and cleanup that neither can cut short.

An ``up`` that is interrupted stops what it started and verifies the GPUs
free before it exits. A second Ctrl-C (people press it twice) or a SIGTERM
(a CI runner's timeout, ``systemctl stop``) during that cleanup must not end
it half-way and leave the server holding its GPUs: while cleanup runs, both
signals are only noted. Signal handlers belong to the main thread: elsewhere
these helpers change nothing.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from types import FrameType
from typing import Any, Callable, Iterator

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _install(handler: Callable[[int, FrameType | None], Any], sigs: tuple[int, ...]) -> dict[int, Any] | None:
    if threading.current_thread() is not threading.main_thread():
        return None
    old = {}
    for s in sigs:
        prev = signal.getsignal(s)
        signal.signal(s, handler)
        old[s] = signal.SIG_DFL if prev is None else prev  # None: set outside Python; restore the default
    return old


def _restore(old: dict[int, Any] | None) -> None:
    for s, h in (old or {}).items():
        signal.signal(s, h)


@contextmanager
def deferred_interrupts(on_signal: Callable[[int], None] | None = None) -> Iterator[list[int]]:
    """Within the block, SIGINT and SIGTERM are recorded (in the yielded list) and reported to
    ``on_signal`` instead of interrupting; the caller decides what to do with them afterwards."""
    got: list[int] = []

    def note(signum: int, _frame: FrameType | None) -> None:
        got.append(signum)
        if on_signal is not None:
            on_signal(signum)

    old = _install(note, _SIGNALS)
    try:
        yield got
    finally:
        _restore(old)


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Within the block, SIGTERM raises KeyboardInterrupt like Ctrl-C, so the same cleanup runs."""

    def raise_interrupt(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt("terminated (SIGTERM)")

    old = _install(raise_interrupt, (signal.SIGTERM,))
    try:
        yield
    finally:
        _restore(old)
