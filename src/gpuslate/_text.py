"""Text that came from processes, made safe to show: the one escaping function.

Process titles, command lines and user names are chosen by whoever runs the
process: ``\\e[2J\\e[31m...`` clears a terminal, a newline forges a line of a
report or of a metrics exposition. Everything gpuslate shows from a process
(the CLI's tables, the exporter's labels) goes through :func:`safe` or
:func:`clean`; it lives here, outside ``cli``, so that the library's own
presenters (``gpuslate.exporter``) share it.
"""

from __future__ import annotations


def safe(text: object) -> str:
    """``text`` with every character that is not printable (C0 and C1 controls, DEL, ESC
    starting a sequence, bidirectional overrides) shown as an escape (``\\x1b``,
    ``\\u202e``), never sent to the terminal: a process can name itself
    ``\\e[2J\\e[31m...``. The one escaping function for whatever gpuslate shows
    from processes (``logs`` alone prints a server's output raw, like ``docker logs``)."""
    s = str(text)
    if s.isprintable():  # the common case, at C speed
        return s
    return "".join(c if c.isprintable() else _escape(c) for c in s)


def _escape(c: str) -> str:
    o = ord(c)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def clean(text: str | None) -> str:
    """One printable line: whitespace runs become one space, the rest goes through :func:`safe`."""
    return safe(" ".join((text or "").split()))


def cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"
