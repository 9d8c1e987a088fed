"""A process's environment as ``/proc/PID/environ`` shows it, and what keeps it readable.

``/proc/PID/environ`` is not a copy: it is the memory between the kernel's
``env_start`` and ``env_end`` of the process, where ``execve`` put the
environment. Whatever the process later writes there shows. Python's
setproctitle (SGLang's ``sglang::scheduler_TP0``, vLLM's ``VLLM::EngineCore``)
makes room for a long title by copying the environment elsewhere and writing
the title over the argument *and* environment area, padded with NUL bytes:
the file then reads as the title's tail and NULs, and every marker a launcher
put there (``SLURM_JOB_ID``, ``GPUSLATE_UNIT_ID``) is gone, although the
process's own ``getenv`` still sees them. PostgreSQL, Perl's ``$0`` and Ruby's
``Process.setproctitle`` do the same.

py-setproctitle reads :data:`SPT_NOENV` once, when it sets up: set to any
non-empty value, it writes titles over the argument area only (a title is
then at most as long as the command line) and the environment stays as
``execve`` left it. ``up`` sets it in every unit's environment, and ``gpuslate
slurm task-prolog`` has Slurm set it in every task's; children inherit it.

:func:`intact` tells an environment as ``execve`` left it from one written
over, in whole or in part, or left empty (``env -i``): only the first can rule
a process out. ``execve`` takes any NUL-ended strings as the environment, and
launchers pass variables of any name: ``app.config=1`` (Java and Kubernetes
tools), ``a-b=2``, even ``=x``; each is a variable, a string with a ``=`` in it.
What is written over an environment is never that: a title's tail, Perl's
spaces, and the NUL padding after them (two NULs in a row: an empty string,
which no launcher passes). So an environment is intact when every string of it
holds a ``=``, whatever the characters of its name (the two strings ``execve``
takes that no program can read as a variable, one without ``=`` and an empty
one, read as written over: the process is then named, never ruled out). A part
is enough to lose the markers: setproctitle writes over the contiguous run of
variables from the first one, and a variable the program removed first
(``unsetenv``) ends that run, so the first variables (a launcher's markers) go
and the later ones stay.
"""

from __future__ import annotations

#: py-setproctitle's switch (src/spt_status.c, save_ps_display_args): non-empty, the environment is kept
SPT_NOENV = "SPT_NOENV"
#: what launchers put in the environments they start: SPT_NOENV=1
KEEP_ENVIRONMENT = {SPT_NOENV: "1"}


def intact(raw: bytes) -> bool:
    """Whether a NUL-separated environment block (a leading NUL allowed: how bounded readers
    search it) is a run of variables, at least one: strings that each hold a ``=`` (any name,
    ``app.config=1`` too: see the module doc); no NUL padding, title or other text in it. A last
    entry without its NUL (the read was cut short) is not judged."""
    entries = raw.split(b"\0")
    if entries[0] == b"":
        entries = entries[1:]
    if not entries:
        return False
    *whole, last = entries  # after the last NUL: nothing, or an entry cut short
    return bool(whole or last) and all(b"=" in e for e in whole)
