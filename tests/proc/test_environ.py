"""What real renaming does to ``/proc/PID/environ``, read from real processes (issue 24), and
:func:`gpuslate.proc.environ.intact` on what they leave:

* py-setproctitle writes its title over the environment (all of it; or, when the program removed a
  variable first, the run of variables before it: the first ones, a launcher's markers) unless
  ``SPT_NOENV`` is set; Perl's ``$0`` writes over it whatever its length (spaces and a NUL);
* ``prctl(PR_SET_NAME)``, ``/proc/self/comm``, ``exec -a`` and Node's ``process.title`` leave it;
* ``env -i`` leaves nothing: not intact either (it can rule nothing out).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslate.proc.environ import SPT_NOENV, intact
from gpuslate.units.fence import read_environ

TITLE = "sglang::scheduler_TP0"
READY = "import sys; sys.stdout.write('r\\n'); sys.stdout.flush(); sys.stdin.read()"


def _run(argv: list[str], env: dict[str, str]) -> tuple[bytes, str]:
    """Start ``argv``, wait until it says it renamed itself, read its environment and name, end it."""
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    try:
        assert p.stdout is not None and p.stdout.readline() == b"r\n"
        raw = read_environ(p.pid)
        assert raw is not None
        with open(f"/proc/{p.pid}/comm") as f:
            return raw, f.read().strip()
    finally:
        p.kill()
        p.wait()


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code + "\n" + READY]


BASE = {"MARK": "1", "PATH": os.environ.get("PATH", "/bin")}


@pytest.mark.parametrize("noenv", [False, True])
def test_setproctitle_writes_over_the_environment_unless_spt_noenv(noenv):
    env = {**BASE, **({SPT_NOENV: "1"} if noenv else {})}
    raw, comm = _run(_py(f"import setproctitle; setproctitle.setproctitle({TITLE!r})"), env)
    assert comm == TITLE[:15]
    assert (b"\0MARK=1\0" in raw) is noenv and intact(raw) is noenv


def test_a_variable_removed_first_leaves_the_later_ones_and_takes_the_first():
    env = {"MARK": "1", "GONE": "x", "LATER": "2"}
    raw, _ = _run(_py(f"import os; os.environ.pop('GONE'); import setproctitle; setproctitle.setproctitle({TITLE!r})"),
                  env)
    assert b"MARK=1" not in raw and b"\0LATER=2\0" in raw and not intact(raw)


@pytest.mark.parametrize("how", ["prctl", "comm", "exec-a"])
def test_renaming_the_kernels_name_or_argv0_keeps_the_environment(how):
    code = {"prctl": "import ctypes; ctypes.CDLL(None).prctl(15, b'renamed', 0, 0, 0)",
            "comm": "open('/proc/self/comm', 'w').write('renamed')", "exec-a": ""}[how]
    argv = _py(code)
    if how == "exec-a":
        argv = ["bash", "-c", f'exec -a renamed {sys.executable} -c "$0"', argv[2]]
    raw, comm = _run(argv, BASE)
    assert b"\0MARK=1\0" in raw and intact(raw)
    assert comm == ("renamed" if how != "exec-a" else os.path.basename(sys.executable)[:15])


def test_an_empty_environment_is_not_intact():
    raw, _ = _run(_py(""), {})
    assert raw == b"\0" and not intact(raw)


@pytest.mark.skipif(shutil.which("perl") is None, reason="no perl")
def test_perls_dollar_zero_writes_over_the_environment_even_when_short():
    raw, comm = _run(["perl", "-e", '$0 = "x"; $| = 1; print "r\\n"; <STDIN>'], BASE)
    assert comm == "x" and b"MARK" not in raw and not intact(raw)


@pytest.mark.skipif(shutil.which("node") is None, reason="no node")
def test_nodes_process_title_keeps_the_environment():
    raw, comm = _run(["node", "-e", "process.title = 'x'.repeat(200); console.log('r'); process.stdin.resume()"],
                     BASE)
    assert comm == "x" * 15 and b"\0MARK=1\0" in raw and intact(raw)


def test_variables_of_any_name_execve_takes_are_intact():
    """Names a launcher may pass that are no C identifier (Java's and Kubernetes' ``app.config``,
    ``a-b``, ``=x``, a name beyond ASCII), given to a real program through execve: intact, the
    marker readable (issue 32: such a program was taken for a renamed one)."""
    env = {**BASE, "app.config": "1", "a-b": "2", "x.y.z": "", "naïve": "3"}
    raw, _ = _run(_py(""), env)
    assert b"\0app.config=1\0" in raw and b"\0MARK=1\0" in raw and intact(raw)
    code = ("import ctypes, sys; libc = ctypes.CDLL(None); A = ctypes.c_char_p; "
            "argv = (A * 4)(sys.executable.encode(), b'-c', sys.argv[1].encode(), None); "
            "env = (A * 4)(b'=x', b'MARK=1', b'app.config=1', None); libc.execve(argv[0], argv, env)")
    raw, _ = _run([sys.executable, "-c", code, READY], {})
    assert raw == b"\0=x\0MARK=1\0app.config=1\0" and intact(raw)


@pytest.mark.parametrize("odd", [b"noequals", b""])
def test_strings_no_program_reads_as_a_variable_are_not_intact(odd):
    """execve also takes a string without '=' and an empty one: no launcher passes them, and they
    are what a title's tail and its NUL padding look like, so they read as written over."""
    code = ("import ctypes, sys; libc = ctypes.CDLL(None); A = ctypes.c_char_p; "
            "argv = (A * 4)(sys.executable.encode(), b'-c', sys.argv[1].encode(), None); "
            f"env = (A * 4)(b'MARK=1', {odd!r}, b'LATER=2', None); libc.execve(argv[0], argv, env)")
    raw, _ = _run([sys.executable, "-c", code, READY], {})
    assert raw == b"\0MARK=1\0" + odd + b"\0LATER=2\0" and not intact(raw)


_NAME = st.binary(max_size=8).filter(lambda b: b"\0" not in b and b"=" not in b)


@given(st.dictionaries(_NAME, st.binary(max_size=8).filter(lambda b: b"\0" not in b), min_size=1, max_size=6),
       st.integers(0, 64))
def test_intact_is_an_execve_block_and_nothing_written_over_it_is(env, cut):
    block = b"".join(k + b"=" + v + b"\0" for k, v in env.items())
    assert intact(block) and intact(b"\0" + block)
    assert intact(block[:max(1, len(block) - cut)])  # a read cut short judges what it has
    n = min(cut, len(block))
    assert not intact(b"\0" * (n + 2) + block[n:])  # a title's padding over the first variables
    assert not intact(b"\0" + b"x" * max(n, 1) + b"\0" + block)  # a title's tail before them
