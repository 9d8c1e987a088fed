"""Readable tables for people, through rich. JSON output never comes through here.

``status`` does not come through here either: its table is laid out by
:mod:`.render_status` without rich, whose import alone costs more than the
rest of the command.
"""

from __future__ import annotations

from typing import IO, Any

from .plain import clean, cut


def console(file: IO[str] | None = None) -> Any:
    """A rich console; piped output keeps every column whole instead of squeezing to 80."""
    import sys

    from rich.console import Console

    out = file or sys.stdout
    return Console(file=out, highlight=False, width=None if out.isatty() else 200)


def one_line(text: str | None, limit: int = 100) -> str:
    """Commands can hold newlines (python -c) and run long: a table row shows
    one line, cut with an ellipsis (``--json`` has the whole command); as rich markup."""
    from rich.markup import escape

    return escape(cut(clean(text), limit))
