"""Readable tables for people, through rich. JSON output never comes through here.

``status`` does not come through here either: its table is laid out by
:mod:`.status` without rich, whose import alone costs more than the
rest of the command.

Everything shown that comes from a process (its title, command line, user,
container, the audit log's copy of them) goes through :func:`~.plain.safe`
(re-exported here), the one escaping function: a process can name itself
``\\e[2J\\e[31m...`` and must not drive the terminal of whoever looks at it.
"""

from __future__ import annotations

import sys
from typing import IO, Any

from .plain import clean, safe, short_command, width_of

__all__ = ["PIPE_WIDTH", "CommandCell", "cell", "clean", "command_limit", "console", "emit", "one_line",
           "process_table", "safe"]

#: width of piped output: wide enough that no column is ever cut
PIPE_WIDTH = 1000


def console(file: IO[str] | None = None) -> Any:
    """A rich console. On a terminal, its width; piped, :data:`PIPE_WIDTH` so that no
    column is cut (use :func:`emit` to print without the padding that width brings)."""
    from rich.console import Console  # lazy: startup

    out = file or sys.stdout
    return Console(file=out, highlight=False, width=None if out.isatty() else PIPE_WIDTH)


def emit(*renderables: Any, file: IO[str] | None = None) -> None:
    """Print renderables, each from a new line; piped output carries no colours and no
    trailing spaces."""
    out = file or sys.stdout
    c = console(out)
    if out.isatty():
        for r in renderables:  # one print each: print(a, b) would join them on one line
            c.print(r)
        return
    with c.capture() as cap:
        for r in renderables:
            c.print(r)
    out.write("".join(line.rstrip() + "\n" for line in cap.get().splitlines()))
    out.flush()


def cell(text: object) -> str:
    """A table cell from process data: escaped for the terminal and for rich markup."""
    from rich.markup import escape  # lazy: startup

    return escape(safe(text))


def one_line(text: str | None, limit: int | None) -> str:
    """A command in a sentence, as rich markup: one line (commands hold newlines: python -c), cut
    from the middle to ``limit`` keeping what names the program (:func:`~.plain.short_command`);
    ``limit`` None (piped): whole (``--json`` has it too)."""
    from rich.markup import escape  # lazy: startup

    return escape(short_command(clean(text), limit))


def command_limit(out: IO[str] | None = None, share: float = 0.5) -> int | None:
    """How long a command quoted in a sentence may be on ``out`` (stdout): ``share`` of the
    terminal's width (at least 24 characters); None when piped: never cut."""
    width = width_of(out or sys.stdout)
    return None if width is None else max(24, int(width * share))


class CommandCell:
    """A table cell holding a command line (after an optional ``prefix`` of markup, such as a
    container's name): measured whole, so that piped it is never cut, and drawn in the width its
    column gets, cut from the middle so that what names the program stays (``python3 -m
    sglang.launch_server … --port 30000``), never wrapped."""

    def __init__(self, command: str | None, prefix: str = "") -> None:
        self.command = clean(command)
        self.prefix = prefix

    def _prefix(self) -> Any:
        from rich.text import Text  # lazy: startup

        return Text.from_markup(self.prefix)

    def __rich_measure__(self, console: Any, options: Any) -> Any:
        from rich.measure import Measurement  # lazy: startup

        n = self._prefix().cell_len + len(self.command)
        return Measurement(min(n, 8), n)

    def __rich_console__(self, console: Any, options: Any) -> Any:
        text = self._prefix()
        text.append(short_command(self.command, max(1, options.max_width - text.cell_len)))
        text.no_wrap = True
        text.overflow = "ellipsis"
        yield text


def process_table(columns: tuple[tuple[str, str], ...]) -> Any:
    """A table of processes that fits the terminal by cutting the Command column
    first: numbers, users and GPUs stay whole at 80 columns."""
    from rich.table import Table  # lazy: startup

    t = Table(box=None, pad_edge=False, collapse_padding=True, header_style="bold")
    for name, just in columns:
        # only Command may shrink (its cells are cut from the middle, see CommandCell)
        t.add_column(name, justify=just, no_wrap=name != "Command",  # type: ignore[arg-type]
                     min_width=8 if name == "Command" else None)
    return t
