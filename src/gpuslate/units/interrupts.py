"""Interrupts around a unit's start: SIGTERM and SIGHUP treated like Ctrl-C, and cleanup that none
of them can cut short.

An ``up`` that is interrupted stops what it started and verifies the GPUs
free before it exits. The ways it is interrupted: Ctrl-C (SIGINT), SIGTERM (a
CI runner's timeout, ``systemctl stop``) and SIGHUP (the ssh session or the
terminal went away: its default action would end ``up`` at once and leave the
server starting, holding its GPUs, with nobody to stop it). A second one of
them during that cleanup (people press Ctrl-C twice; a dropped session sends
SIGHUP and then SIGCONT, a CI runner SIGTERM then SIGKILL) must not end it
half-way: while cleanup runs, they are only noted. The terminal may be gone
by then: noting them never fails on its account. Signal handlers belong to
the main thread: elsewhere these helpers change nothing.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: the signals that, outside cleanup, stop a start like Ctrl-C does (SIGINT raises KeyboardInterrupt already)
_AS_CTRL_C = {signal.SIGTERM: "terminated (SIGTERM)", signal.SIGHUP: "hung up (SIGHUP): the terminal went away"}


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
def deferred_interrupts(on_signal: Callable[[int], None] | None = None,
                        signals: tuple[int, ...] = _SIGNALS) -> Iterator[list[int]]:
    """Within the block, SIGINT, SIGTERM and SIGHUP (or only ``signals``) are recorded (in the
    yielded list) and reported to ``on_signal`` instead of interrupting; the caller decides what
    to do with them afterwards. ``on_signal`` failing (a write to a terminal that is gone)
    interrupts nothing. ``down`` defers SIGHUP alone: a dropped ssh session must not leave a unit
    half-stopped, while Ctrl-C and SIGTERM keep their meaning (someone asked)."""
    got: list[int] = []

    def note(signum: int, _frame: FrameType | None) -> None:
        got.append(signum)
        if on_signal is not None:
            try:
                on_signal(signum)
            except (OSError, ValueError):
                pass

    old = _install(note, signals)
    try:
        yield got
    finally:
        _restore(old)


@contextmanager
def stop_signals_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise KeyboardInterrupt like Ctrl-C, so the same
    cleanup runs."""

    def raise_interrupt(signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt(_AS_CTRL_C.get(signal.Signals(signum), "interrupted"))

    old = _install(raise_interrupt, tuple(_AS_CTRL_C))
    try:
        yield
    finally:
        _restore(old)

