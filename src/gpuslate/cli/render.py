"""Readable tables for people, through rich. JSON output never comes through here.

``status`` does not come through here either: its table is laid out by
:mod:`.render_status` without rich, whose import alone costs more than the
rest of the command.

Everything shown that comes from a process (its title, command line, user,
container, the audit log's copy of them) goes through :func:`~.plain.safe`
(re-exported here), the one escaping function: a process can name itself
``\\e[2J\\e[31m...`` and must not drive the terminal of whoever looks at it.
"""

from __future__ import annotations

import sys
from typing import IO, Any

from .plain import clean, cut, safe

__all__ = ["PIPE_WIDTH", "cell", "clean", "console", "emit", "fitted_cell", "one_line", "process_table", "safe"]

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


def one_line(text: str | None, limit: int = 100) -> str:
    """Commands can hold newlines (python -c) and run long: a table row shows
    one line, cut with an ellipsis (``--json`` has the whole command); as rich markup."""
    from rich.markup import escape  # lazy: startup

    return escape(cut(clean(text), limit))


def fitted_cell(markup: str) -> Any:
    """A cell that is cut (``…``), never wrapped, when its column must shrink."""
    from rich.text import Text  # lazy: startup

    text = Text.from_markup(markup, overflow="ellipsis")
    text.no_wrap = True
    return text


def process_table(columns: tuple[tuple[str, str], ...]) -> Any:
    """A table of processes that fits the terminal by cutting the Command column
    first: numbers, users and GPUs stay whole at 80 columns."""
    from rich.table import Table  # lazy: startup

    t = Table(box=None, pad_edge=False, collapse_padding=True, header_style="bold")
    for name, just in columns:
        # only Command may shrink (its cells are cut with an ellipsis, see fitted_cell)
        t.add_column(name, justify=just, no_wrap=name != "Command",  # type: ignore[arg-type]
                     min_width=8 if name == "Command" else None)
    return t
