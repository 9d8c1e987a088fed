"""Plain-text tables with optional ANSI colour, for the commands on the fast path.

``gpuslate status`` must stay close to the Python floor, and importing rich
costs more than everything else the command does (about 25 ms of imports and
10 ms of layout on the H200). Its table is simple enough to lay out here:
fixed columns, one line per row, one column that may be cut to fit.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import IO, Literal, NamedTuple

from ..._text import clean, cut, safe, short_command  # noqa: F401 - re-exported: the CLI's renderers import them

Style = Literal["bold", "dim", "red", "green", "yellow", "cyan", "magenta"]
Justify = Literal["left", "right"]
_SGR: dict[str, str] = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33", "cyan": "36",
                        "magenta": "35"}


class Cell(NamedTuple):
    """Text (already one clean line) and the styles it is shown in."""

    text: str
    styles: tuple[Style, ...] = ()


class Column(NamedTuple):
    header: str
    justify: Justify = "left"
    max_width: int | None = None  # cut longer cells with an ellipsis
    command: bool = False  # command lines: cut from the middle, keeping what names the program (short_command)


def use_color(out: IO[str]) -> bool:
    """Colour for terminals only, and never when NO_COLOR is set or TERM is dumb (as rich does)."""
    return out.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


def width_of(out: IO[str]) -> int | None:
    """The terminal's width: ``$COLUMNS`` when set (as rich, ``shutil`` and ``ls`` take it), else
    what the terminal says, else 80; ``None`` (no limit) when piped, so no column is squeezed."""
    if not out.isatty():
        return None
    columns = os.environ.get("COLUMNS", "")
    if columns.isascii() and columns.isdigit() and 0 < int(columns) < 100_000:
        return int(columns)
    try:
        return os.get_terminal_size(out.fileno()).columns
    except (OSError, ValueError):
        return 80


def paint(text: str, styles: Sequence[Style], color: bool) -> str:
    if not color or not styles or not text:
        return text
    return f"\x1b[{';'.join(_SGR[s] for s in styles)}m{text}\x1b[0m"


def table(columns: Sequence[Column], rows: Sequence[Sequence[Cell]], *, color: bool, width: int | None,
          shrink: int | None = None, gap: int = 1) -> list[str]:
    """Lines of a table: a bold header, then one line per row.

    With ``width``, column ``shrink`` (the only one allowed to lose text) is cut
    so that the line fits; the others are shown whole.
    """
    cutters = [short_command if c.command else cut for c in columns]
    limits = [c.max_width for c in columns]
    cells = [[Cell(cut(cell.text, lim) if (lim := limits[i]) else cell.text, cell.styles)
              for i, cell in enumerate(row)] for row in rows]
    widths = [max([len(c.header)] + [len(r[i].text) for r in cells]) for i, c in enumerate(columns)]
    if width is not None and shrink is not None:
        over = sum(widths) + gap * (len(widths) - 1) - width
        if over > 0:
            widths[shrink] = max(len(columns[shrink].header), widths[shrink] - over)
            cells = [[Cell(cutters[shrink](c.text, widths[shrink]), c.styles) if i == shrink else c
                      for i, c in enumerate(r)] for r in cells]
    sep = " " * gap

    def line(row: Sequence[Cell]) -> str:
        parts = []
        for i, (cell, col) in enumerate(zip(row, columns)):
            pad = " " * (widths[i] - len(cell.text))
            text = paint(cell.text, cell.styles, color)
            parts.append(pad + text if col.justify == "right" else text + pad)
        return sep.join(parts).rstrip()

    return [line([Cell(c.header, ("bold",)) for c in columns])] + [line(r) for r in cells]


def tables(columns: Sequence[Column], rows: Sequence[Sequence[Cell]], *, color: bool, width: int | None,
           keys: int = 1, gap: int = 2) -> list[str]:
    """Lines of a table that is never cut: on a terminal too narrow for it, several tables one
    under the other (a blank line between), each with the first ``keys`` columns (what names a
    row: the level, the deployment) and as many of the other columns, in order, as fit ``width``.
    Piped (``width`` None), or when it fits, one table."""
    def w(i: int) -> int:
        return max([len(columns[i].header)] + [len(r[i].text) for r in rows])

    widths = [w(i) for i in range(len(columns))]
    if width is None or sum(widths) + gap * (len(widths) - 1) <= width:
        return table(columns, rows, color=color, width=None, gap=gap)
    head = list(range(keys))
    groups: list[list[int]] = [[]]
    used = sum(widths[:keys]) + gap * (keys - 1)
    for i in range(keys, len(columns)):
        if groups[-1] and used + gap + widths[i] > width:
            groups.append([])
            used = sum(widths[:keys]) + gap * (keys - 1)
        groups[-1].append(i)
        used += gap + widths[i]
    out: list[str] = []
    for group in groups:
        pick = head + group
        if out:
            out.append("")
        out += table([columns[i] for i in pick], [[r[i] for i in pick] for r in rows], color=color, width=None,
                     gap=gap)
    return out


def wrapped(parts: Sequence[str], width: int | None, sep: str = "; ") -> list[str]:
    """``parts`` joined by ``sep`` into lines of at most ``width`` characters, broken at spaces;
    one line when ``width`` is None (piped)."""
    text = sep.join(parts)
    if width is None or not text:
        return [text] if text else []
    import textwrap  # lazy: startup

    return textwrap.wrap(text, width, break_on_hyphens=False)


def folded(text: str, width: int | None, indent: str = "    ") -> str:
    """A sentence on a terminal of ``width`` columns: broken at spaces into lines that fit, the next
    ones indented, never inside a word (a PID, a path); piped (``width`` None), one line."""
    if width is None or len(text) <= width:
        return text
    import textwrap  # lazy: startup

    return "\n".join(textwrap.wrap(text, width, subsequent_indent=indent, break_long_words=False,
                                   break_on_hyphens=False))
