"""The line of a wait under way: one line, cut to the terminal, and what a server wrote into its
log (the news shown) escaped, never sent to the terminal as it is."""

from __future__ import annotations

import io

from gpuslate.cli.render.live import LiveLine, progress_text
from gpuslate.host.session import Progress


def test_one_escaped_line_cut_to_the_width() -> None:
    p = Progress("web: waiting until ready (sglang)", 12.34, 900.0, "\x1b[2J\x1b[31mloading\r\nweights " + "x" * 200)
    text = progress_text(p, 80)
    assert len(text) <= 79 and "\x1b" not in text and "\r" not in text and "\n" not in text
    assert text[1:].startswith(" web: waiting until ready (sglang) 12.3s of 15m00s  \\x1b[2J\\x1b[31mloading we")
    assert text.endswith("…")
    assert progress_text(Progress("clear", 75.0, None, ""), 80)[1:] == " clear 1m15s"


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_drawn_in_place_erased_when_done_and_nothing_when_off() -> None:
    out = Tty()
    live = LiveLine(True, out)
    live.progress(Progress("wait", 0.5, 60.0, "GPU 0 2.0 GiB still used"))
    live.progress(Progress("wait", 0.75, 60.0, "GPU 0 1.0 GiB still used"))
    live.progress(Progress("wait", 0.8, 60.0, "", done=True))
    shown = out.getvalue()
    assert shown.count("\r\x1b[K") == 3 and shown.endswith("\r\x1b[K") and "1.0 GiB" in shown
    off = Tty()
    assert LiveLine(False, off).sink is None and off.getvalue() == ""
