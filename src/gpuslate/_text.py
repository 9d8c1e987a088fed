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


#: programs that run another program named by their arguments (a script, a module)
_INTERPRETERS = ("python", "pypy", "node", "bash", "sh", "dash", "zsh", "perl", "ruby", "Rscript", "julia", "lua")
#: interpreter options that take the next word as their value (python -W x, -X opt; node -r mod)
_OPTION_VALUES = {"-W", "-X", "-r", "--require", "--import"}


def _is_interpreter(word: str) -> bool:
    base = word.rsplit("/", 1)[-1]
    return any(base == name or (base.startswith(name) and base[len(name):].replace(".", "").isdigit())
               for name in _INTERPRETERS)


def _program_start(words: list[str]) -> int:
    """The first word after ``env`` and its options and ``VAR=value`` (0 without ``env``)."""
    i = 0
    if words and words[0].rsplit("/", 1)[-1] == "env":
        i = 1
        while i < len(words) and ("=" in words[i] or words[i].startswith("-")):
            i += 1
    return i


def program_end(words: list[str]) -> int:
    """How many of ``words`` (a command line split at spaces) name the program: the first word;
    after an interpreter (``python3``, ``bash``, ``node``..., also behind ``env`` and its
    ``VAR=value``) and its options, the script or ``-m module`` it runs; then one subcommand
    (``vllm serve``) when the next word is one (no option, no path)."""
    i = _program_start(words)
    if i >= len(words):
        return len(words)
    if not _is_interpreter(words[i]):
        end = i + 1
    else:
        j = i + 1
        while j < len(words) and words[j].startswith("-") and words[j] not in ("-m", "-c", "-e", "--"):
            j += 2 if words[j] in _OPTION_VALUES else 1
        if j < len(words) and words[j] in ("-m", "-c", "-e"):
            j += 1  # the module (the code of -c: its first word)
        end = min(len(words), j + 1)
    if end < len(words) and not words[end].startswith("-") and "/" not in words[end] and len(words[end]) <= 16:
        end += 1
    return end


def short_command(text: str, limit: int | None) -> str:
    """A command line (one clean line) in at most ``limit`` characters, cut from the middle so that
    the part naming the program stays (see :func:`program_end`: ``python3 -m sglang.launch_server``,
    the script after ``/x/.venv/bin/python3``) with the end of the arguments after ``…``; the
    interpreter's and then the script's folders go first when that part alone is too long.
    ``limit`` None (piped output): the whole line, never cut."""
    if limit is None or len(text) <= limit:
        return text
    words = text.split(" ")
    end = program_end(words)
    head, rest = words[:end], words[end:]

    def base(w: str) -> str:
        return w if "/" not in w.rstrip("/") else "…/" + w.rstrip("/").rsplit("/", 1)[-1]

    # a program's folder says least: the interpreter's goes first, then env's variables, then the
    # script's folder
    start = min(_program_start(words), end - 1)
    heads = [[base(head[0]), *head[1:]] if len(head) > 1 else head]
    if start:
        heads.append(["…", base(head[start]), *head[start + 1:]])
    heads.append([base(w) for w in head[start:]])
    for h in heads:
        shown = " ".join(h)
        room = limit - len(shown) - 2  # " …", then " " and the end of the arguments
        if room < 0:
            continue
        tail: list[str] = []
        for w in reversed(rest):
            if len(" ".join([w, *tail])) + 1 > room:
                break
            tail.insert(0, w)
        if len(tail) == len(rest):
            return " ".join([*h, *rest])
        # the width left goes to the first arguments (a path among them as its last component,
        # ``--model-path …/Llama-3.1-405B``), so that no column is left empty beside a cut command
        lead: list[str] = []
        middle = rest[:len(rest) - len(tail)]
        for w in middle:
            done = len(lead) + 1 == len(middle)  # the last one missing: no "…" once it is in
            fits = [v for v in (w, base(w)) if
                    len(" ".join([*h, *lead, v, *([] if done else ["…"]), *tail])) <= limit]
            if not fits:
                break
            lead.append(fits[0])
        if len(lead) == len(middle):
            return " ".join([*h, *lead, *tail])
        return " ".join([*h, *lead, "…", *tail])
    return cut(" ".join([*heads[-1], *rest]), limit)  # cut at its end, so that it never reads as whole
