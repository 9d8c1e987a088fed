"""The documentation runs as written: every shell and Python block of README.md and docs/*.md is
executed, page by page, on a simulated host in a temporary folder; every TOML block is read by the
parser it documents. A page whose example drifted from the program fails here.

How a page runs (:func:`run_page`):

* its fenced blocks in order; ```sh/```bash blocks in one ``bash`` session for the whole page
  (variables, ``cd`` and ``export`` carry over, as in a terminal), ```console blocks likewise
  (only the ``$ `` lines; the rest is output), ```python blocks in one interpreter for the page,
  started at the first Python block with the shell's environment and folder at that moment (as a
  person who types ``python3`` in that terminal); other blocks (JSON, tables, output) are not run;
* with ``GPUSLATE_SIM`` a fresh simulated 8-GPU host, ``GPUSLATE_STATE_DIR`` a fresh state folder,
  ``TMPDIR`` and ``HOME`` folders of the test, the current folder an empty one holding
  ``.venv/bin/activate`` (and ``gpuslate``, ``python3`` there), ``PATH`` starting with a
  ``gpuslate`` that runs this checkout;
* a command that fails fails the page (bash's ``ERR`` trap: the ``set -e`` rule, without leaving
  the session), as an exception or a non-zero ``SystemExit`` of a Python block does;
* a command put in the background (a line ending in ``&``) is waited for until it has printed its
  first line (as a person waits for a server's or a holder's "ready" before typing on);
* at the end every unit still running is stopped (``gpuslate down``), every process of the page's
  sessions killed, and every simulated host of the page cleared.

A block that cannot run here says so, visibly, in an HTML comment on the line(s) just above it:

* ``<!-- docs-test: skip (WHY) -->``: not run (a real GPU host, a host over ssh, Slurm, PyPI, the
  README's quick-start commands themselves, a run of minutes); :data:`MAX_SKIPPED` bounds them;
* ``<!-- docs-test: sub "OLD" "NEW" (WHY) -->``: run with OLD replaced by NEW (a real engine's
  command by the simulated server's, a long run made short); OLD must occur in the block;
* ``<!-- docs-test: file NAME -->``: the block is a file of the page (``gpuslate.toml``), written
  to the page's folder before its first block runs;
* ``<!-- docs-test: setup "COMMAND" (WHY) -->``: a shell command run before the block (the
  server a ``bench`` example loads).
"""

from __future__ import annotations

import difflib
import json
import os
import pwd
import re
import selectors
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpuslate.gpu.simhost.host import SimHost
from gpuslate.proc.procfs import list_pids, read_stat
from helpers import GiB, gpuslate_env

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN = {"sh", "bash", "console", "python"}
#: blocks that cannot run here (each says why in its page); more than this and the docs drift unseen
MAX_SKIPPED = 14
BLOCK_TIMEOUT = 90.0  # seconds for one block; a page's whole run is far below (see the slow marker)

FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,})\s*([\w+-]*)\s*$")
DIRECTIVE = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<body>.*?)\s*-->\s*$")
REASON = re.compile(r"\s*\((?P<why>[^()]*(?:\([^()]*\)[^()]*)*)\)\s*$")
#: an untagged block that starts like this is a command a reader will paste: it must be tagged
COMMAND_START = re.compile(r"^\s*(\$ )?(gpuslate|python3?|pip|\.venv/bin/\S+|ssh|curl|sudo) ")


@dataclass
class Directive:
    verb: str  # skip | sub | file | setup
    args: list[str]
    why: str
    line: int


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence
    lang: str
    text: str
    directives: list[Directive] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    def first(self, verb: str) -> Directive | None:
        return next((d for d in self.directives if d.verb == verb), None)

    @property
    def skipped(self) -> bool:
        return self.first("skip") is not None

    @property
    def runs(self) -> bool:
        return self.lang in RUN and not self.skipped and self.first("file") is None

    def source(self) -> str:
        """The text that runs: the block with its substitutions made."""
        text = self.text
        for d in self.directives:
            if d.verb == "sub":
                text = text.replace(d.args[0], d.args[1])
        return text


def parse_directive(body: str, line: int) -> Directive:
    m = REASON.search(body)
    why = m.group("why").strip() if m else ""
    rest = body[:m.start()] if m else body
    words = shlex.split(rest)
    return Directive(words[0] if words else "", words[1:], why, line)


def blocks(page: Path, text: str | None = None) -> list[Block]:
    """The fenced blocks of a page (``text``: the page as it is run), each with the docs-test
    directives just above it."""
    out: list[Block] = []
    lines = (page.read_text() if text is None else text).splitlines()
    pending: list[Directive] = []
    i = 0
    while i < len(lines):
        d = DIRECTIVE.match(lines[i])
        if d:
            pending.append(parse_directive(d.group("body"), i + 1))
            i += 1
            continue
        m = FENCE.match(lines[i])
        if not m:
            if lines[i].strip():
                pending = []  # a directive applies to the block right below it only
            i += 1
            continue
        indent, fence, lang = m.groups()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not (lines[i].strip().startswith(fence[0] * len(fence))
                                      and not lines[i].strip().strip(fence[0])):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        out.append(Block(page, start + 1, lang.lower(), "\n".join(body) + "\n", pending))
        pending = []
        i += 1
    return out


ALL = [b for p in PAGES for b in blocks(p)]


# -- what every page says about its blocks -----------------------------------------


def test_every_directive_is_known_and_says_why():
    for b in ALL:
        for d in b.directives:
            where = f"{b.page.relative_to(ROOT)}:{d.line}"
            assert d.verb in ("skip", "sub", "file", "setup"), f"{where}: unknown docs-test directive {d.verb!r}"
            if d.verb != "file":
                assert len(d.why) >= 10, f"{where}: say why (in parentheses at the end)"
            if d.verb == "sub":
                assert len(d.args) == 2, f"{where}: sub \"OLD\" \"NEW\""
                assert d.args[0] in b.text, f"{where}: {d.args[0]!r} is not in the block below it any more"
            if d.verb == "file":
                assert len(d.args) == 1 and "/" not in d.args[0], f"{where}: file NAME"
            if d.verb == "setup":
                assert len(d.args) == 1, f"{where}: setup \"COMMAND\" (WHY)"
        assert not (b.skipped and len(b.directives) > 1), f"{b.where}: a skipped block needs no other directive"


def test_few_blocks_are_skipped_and_most_commands_run():
    skipped = [b for b in ALL if b.lang in RUN and b.skipped]
    runs = [b for b in ALL if b.runs]
    assert len(skipped) <= MAX_SKIPPED, "\n".join(f"{b.where}: {b.first('skip').why}" for b in skipped)  # type: ignore[union-attr]
    assert len(runs) >= 7 and {b.page.name for b in runs} >= {"README.md", "units.md", "bench.md"}


def test_command_blocks_are_tagged_so_that_they_run():
    """An untagged block that a reader would paste (it starts with a command) is tagged ```sh, so
    that it runs here (or says why not)."""
    for b in ALL:
        if b.lang == "":
            first = next((ln for ln in b.text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")), "")
            assert not COMMAND_START.match(first), f"{b.where}: a command block: tag it ```sh"


def test_every_toml_block_reads_as_what_it_documents(tmp_path):
    """An experiment spec is read by ``load_spec``, a unit file by ``load_config`` and each of its units
    resolved, as ``experiment run`` and ``up`` read them: a spec that exits 2 fails here."""
    from gpuslate.bench.spec import load_spec
    from gpuslate.units.spec import load_config, resolve

    checked = 0
    for b in (b for b in ALL if b.lang == "toml" and not b.skipped):
        path = tmp_path / f"{b.page.stem}-{b.line}.toml"
        path.write_text(b.text)
        if "[experiment]" in b.text:
            spec = load_spec(path)
            assert spec.deployments, b.where
        else:
            units = load_config(path)
            assert units, f"{b.where}: no [units.NAME] table"
            for name in units:
                resolve(name, config=path)
        checked += 1
    assert checked >= 2


# -- running a page ------------------------------------------------------------------

PRELUDE = r"""
set -E
__docs_run() {
  __docs_failed=0
  trap '__rc=$?; __docs_failed=1
        printf "exit %s at line %s: %s\n" "$__rc" "$LINENO" "$BASH_COMMAND" >> "$__docs/$1.err"' ERR
  . "$__docs/$1.sh" > "$__docs/$1.out" 2>&1 < /dev/null
  trap - ERR
  printf '__docs_done__ %s %s\n' "$1" "$__docs_failed"
}
__docs_await() {  # a background command: until it printed its first line, or ended
  local i=0
  while [ ! -s "$2" ] && kill -0 "$1" 2>/dev/null && [ $i -lt 3000 ]; do sleep 0.01; i=$((i+1)); done
  cat "$2"
}
__docs_env() {
  env -0 > "$__docs/$1.env"; pwd > "$__docs/$1.pwd"
  printf '__docs_done__ %s 0\n' "$1"
}
"""

#: the page's Python interpreter: runs each block file it is sent in one namespace, its output
#: (fds 1 and 2, so a subprocess's too) into the block's .out file; "done N STATUS" on the fd argv[1] names
PY_DRIVER = r"""
import os, sys, traceback
done = os.fdopen(int(sys.argv[1]), "w")
scope = {"__name__": "__main__"}
for line in sys.stdin:
    n, path = line.split(maxsplit=1)
    path = path.strip()
    out = os.open(path[:-3] + ".out", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    saved = os.dup(1), os.dup(2)
    sys.stdout.flush(); sys.stderr.flush()
    os.dup2(out, 1); os.dup2(out, 2)
    status = 0
    try:
        exec(compile(open(path).read(), path, "exec"), scope)
    except SystemExit as exc:
        status = 0 if exc.code in (None, 0) else 1
        if status:
            print(f"SystemExit: {exc.code}", file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        status = 1
    sys.stdout.flush(); sys.stderr.flush()
    os.dup2(saved[0], 1); os.dup2(saved[1], 2)
    for fd in (*saved, out):
        os.close(fd)
    done.write(f"done {n} {status}\n"); done.flush()
"""

BG = re.compile(r"^(?P<indent>\s*)(?P<cmd>.*?[^&|>\s])\s*&\s*(?P<comment>#.*)?$")


def logical_lines(text: str) -> list[str]:
    """Lines with their ``\\`` continuations joined (a background ``&`` ends the logical line)."""
    out: list[str] = []
    buf = ""
    for ln in text.splitlines():
        if ln.endswith("\\"):
            buf += ln[:-1] + " "
            continue
        out.append(buf + ln)
        buf = ""
    if buf:
        out.append(buf)
    return out


def shell_source(block: Block, n: int) -> str:
    """The block as the page's shell runs it: ``$ `` lines only for console blocks, and each
    background command waited for until it has said something."""
    text = block.source()
    if block.lang == "console":
        text = "\n".join(ln[2:] for ln in logical_lines(text) if ln.startswith("$ "))
    lines: list[str] = []
    for k, ln in enumerate(logical_lines(text)):
        m = BG.match(ln)
        if m and not ln.lstrip().startswith("#"):
            out = f'"$__docs/bg-{n}-{k}.out"'
            # as a terminal's shell starts a job: in a process group of its own, led by the command
            # itself where it is one (what `status` shows as the job's launcher)
            cmd = m["cmd"] if not re.search(r"[;|]|&&", m["cmd"]) else f"{{ {m['cmd']} ; }}"
            ln = f"{m['indent']}set -m; {cmd} > {out} 2>&1 & set +m; __docs_await $! {out}"
        lines.append(ln)
    return "\n".join(lines) + "\n"


def console_output(block: Block) -> str:
    """What a ```console block shows its commands printing: its lines that are not ``$ `` commands."""
    return "\n".join(ln for ln in logical_lines(block.source()) if not ln.startswith("$ "))


_DIGITS = re.compile(r"\d+")
_PATH = re.compile(r"(?<!\S)\S*/(?=[^/\s]+)")
_SPACES = re.compile(r" {2,}")


def shown(text: str) -> list[str]:
    """Output as a page shows it and as a run printed it, made comparable: what differs between two
    runs of the same thing, or between the page's machine and this one, is made the same (every
    number, so PIDs, sizes, times and dates; this host's name, ``gpu-host`` on the page; this user,
    ``alice``; a path, by its last component: ``…/python``; ``python3`` is ``python``), and the
    padding those change is one space. The rest (columns, rows, words) must be as the page shows."""
    host, user = os.uname().nodename, pwd.getpwuid(os.getuid()).pw_name
    out = []
    for line in text.strip("\n").splitlines():
        line = re.sub(rf"(?<![\w-]){re.escape(host)}(?![\w-])", "gpu-host", line)
        line = re.sub(rf"(?<![\w-]){re.escape(user)}(?![\w-])", "alice", line)
        line = re.sub(r"\bpython3\b", "python", _PATH.sub("…/", line))
        out.append(_SPACES.sub(" ", _DIGITS.sub("0", line)).strip())
    return out


def _sessions_kill(sids: set[int]) -> None:
    """SIGKILL every process of these sessions (the page's shell and interpreter: ours alone)."""
    for pid in list_pids():
        st = read_stat(pid)
        if st is not None and st.sid in sids and pid != os.getpid():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class Page:
    """One page's shell session and (from its first Python block) interpreter."""

    def __init__(self, page: Path, tmp: Path) -> None:
        self.page = page
        self.dir = tmp / "blocks"
        self.work = tmp / "work"
        for d in (self.dir, self.work, tmp / "tmp", tmp / "home", tmp / "bin"):
            d.mkdir(parents=True)
        sim = SimHost.init(tmp / "sim", gpus=8, memory=96 * GiB, release_delay=0.1)
        # as pip writes a console script: what a reader's `gpuslate` runs as (a process's command line)
        wrapper = f"#!{sys.executable}\nimport sys\nfrom gpuslate.cli import run\nsys.exit(run())\n"
        python = f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n'
        venv = self.work / ".venv" / "bin"
        venv.mkdir(parents=True)
        for folder in (tmp / "bin", venv):
            for name, text in (("gpuslate", wrapper), ("python3", python), ("python", python)):
                (folder / name).write_text(text)
                (folder / name).chmod(0o755)
        (venv / "activate").write_text(f'PATH={shlex.quote(str(venv))}:"$PATH"; export PATH\n')
        self.env = gpuslate_env({
            "GPUSLATE_SIM": str(sim.root), "GPUSLATE_STATE_DIR": str(tmp / "state"), "TMPDIR": str(tmp / "tmp"),
            "HOME": str(tmp / "home"), "PATH": os.pathsep.join([str(tmp / "bin"), str(Path(sys.executable).parent),
                                                                os.environ.get("PATH", "/usr/bin:/bin")]),
            "COLUMNS": "100", "PYTHONDONTWRITEBYTECODE": "1", "__docs": str(self.dir),
        })
        for var in ("GPUSLATE_CONFIG", "GPUSLATE_LOCK_DIR", "CUDA_VISIBLE_DEVICES", "VIRTUAL_ENV"):
            self.env.pop(var, None)
        self.sims = {str(sim.root)}
        self.states = {str(tmp / "state")}
        self.shell = subprocess.Popen(["bash", "--noprofile", "--norc"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, cwd=self.work, env=self.env, text=True,
                                      start_new_session=True)
        self.python: subprocess.Popen[str] | None = None
        self.py_done: int | None = None
        self._send(PRELUDE)
        self.failures: list[str] = []
        self.timings: list[tuple[str, float]] = []

    def _send(self, text: str) -> None:
        assert self.shell.stdin is not None
        self.shell.stdin.write(text)
        self.shell.stdin.flush()

    def _await(self, fd: int, n: str, what: str) -> int:
        """Until the line ``... N STATUS`` on ``fd``; the status (0: fine)."""
        sel = selectors.DefaultSelector()
        sel.register(fd, selectors.EVENT_READ)
        deadline = time.monotonic() + BLOCK_TIMEOUT
        buf = b""
        while True:
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                words = line.decode().split()
                if len(words) == 3 and words[1] == n:
                    sel.close()
                    return int(words[2])
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                sel.close()
                raise AssertionError(f"{what}: no end after {BLOCK_TIMEOUT:g} s\n{self.output(n)}")
            chunk = os.read(fd, 4096)
            if not chunk:
                sel.close()
                raise AssertionError(f"{what}: the session ended\n{self.output(n)}")
            buf += chunk

    def output(self, n: str) -> str:
        parts = []
        for suffix in ("out", "err"):
            p = self.dir / f"{n}.{suffix}"
            if p.exists():
                parts.append(p.read_text(errors="replace")[-4000:])
        return "\n".join(parts)

    def run_shell(self, n: str, source: str) -> int:
        (self.dir / f"{n}.sh").write_text(source)
        self._send(f"__docs_run {n}\n")
        assert self.shell.stdout is not None
        return self._await(self.shell.stdout.fileno(), n, f"shell block {n}")

    def shell_env(self, n: str) -> tuple[dict[str, str], str]:
        self._send(f"__docs_env {n}\n")
        assert self.shell.stdout is not None
        self._await(self.shell.stdout.fileno(), n, "the shell's environment")
        raw = (self.dir / f"{n}.env").read_bytes().split(b"\0")
        env = dict(item.decode().split("=", 1) for item in raw if b"=" in item)
        return env, (self.dir / f"{n}.pwd").read_text().strip()

    def run_python(self, n: str, source: str) -> int:
        if self.python is None:
            env, cwd = self.shell_env(f"{n}-env")
            r, w = os.pipe()
            self.python = subprocess.Popen([sys.executable, "-c", PY_DRIVER, str(w)], stdin=subprocess.PIPE,
                                           text=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd,
                                           env=env, pass_fds=(w,), start_new_session=True)
            os.close(w)
            self.py_done = r
        (self.dir / f"{n}.py").write_text(source)
        assert self.python.stdin is not None and self.py_done is not None
        self.python.stdin.write(f"{n} {self.dir / f'{n}.py'}\n")
        self.python.stdin.flush()
        return self._await(self.py_done, n, f"python block {n}")

    def run(self, todo: list[Block]) -> None:
        for i, b in enumerate(todo):
            n = f"b{i}"
            t0 = time.monotonic()
            for k, d in enumerate(d for d in b.directives if d.verb == "setup"):
                status = self.run_shell(f"{n}-setup{k}", shell_source(Block(b.page, d.line, "sh", d.args[0] + "\n"),
                                                                      k))
                if status:
                    self.failures.append(f"{b.where}: setup {d.args[0]!r} failed:\n{self.output(f'{n}-setup{k}')}")
            run = self.run_python if b.lang == "python" else self.run_shell
            status = run(n, b.source() if b.lang == "python" else shell_source(b, i))
            self.timings.append((b.where, time.monotonic() - t0))
            if status:
                self.failures.append(f"{b.where} failed:\n{textwrap.indent(self.output(n), '    ')}")
            elif b.lang == "console" and (wanted := console_output(b)):
                got = (self.dir / f"{n}.out").read_text(errors="replace")
                if shown(got) != shown(wanted):
                    diff = "\n".join(difflib.unified_diff(shown(wanted), shown(got), "the page", "the run",
                                                         lineterm=""))
                    self.failures.append(f"{b.where}: the output shown is not what it prints (compared as "
                                         f"tests/test_docs_run.py's shown() does):\n{textwrap.indent(diff, '    ')}")

    def close(self) -> None:
        """Stop what the page left running (units, background commands, simulated holders)."""
        try:
            env, _ = self.shell_env("final")
            if env.get("GPUSLATE_SIM"):
                self.sims.add(env["GPUSLATE_SIM"])
            if env.get("GPUSLATE_STATE_DIR"):
                self.states.add(env["GPUSLATE_STATE_DIR"])
        except AssertionError:
            pass
        for stream in (self.shell.stdin, self.python.stdin if self.python else None):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        sids = {self.shell.pid} | ({self.python.pid} if self.python else set())
        _sessions_kill(sids)
        for sim in sorted(self.sims):
            if not (Path(sim) / "host.json").is_file():
                continue
            for state in sorted(self.states):
                env = {**self.env, "GPUSLATE_SIM": sim, "GPUSLATE_STATE_DIR": state}
                ps = subprocess.run([sys.executable, "-m", "gpuslate", "ps", "--json"], env=env, capture_output=True,
                                    text=True, timeout=60)
                units = json.loads(ps.stdout)["units"] if ps.returncode == 0 else []
                for u in units:
                    if u["processes"]:
                        subprocess.run([sys.executable, "-m", "gpuslate", "down", u["name"], "--timeout", "20"],
                                       env=env, capture_output=True, timeout=60)
            subprocess.run([sys.executable, "-m", "gpuslate", "clear", "--yes", "--grace", "1", "--timeout", "15"],
                           env={**self.env, "GPUSLATE_SIM": sim}, capture_output=True, timeout=60)
        for p in (self.shell, self.python):
            if p is not None:
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
        if self.py_done is not None:
            os.close(self.py_done)


#: the ports the pages use, as servers' own defaults (SGLang's, vLLM's)
PAGE_PORTS = ("30000", "8000")


def on_free_ports(text: str) -> str:
    """The page with each of :data:`PAGE_PORTS` replaced by a free port, the same one wherever it
    occurs: two runs of the suite on one machine (or another program listening there) never meet on
    a port. A port is a whole number: 30000 inside 1730000000 is no port."""
    for port in PAGE_PORTS:
        text = re.sub(rf"(?<![\d.]){port}(?![\d.])", str(free_port()), text)
    return text


def free_port() -> int:
    import socket  # lazy: only the pages that run

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_page(page: Path, tmp: Path) -> Page:
    text = on_free_ports(page.read_text())
    todo = [b for b in blocks(page, text) if b.runs]
    p = Page(page, tmp)
    try:
        for b in blocks(page, text):
            f = b.first("file")
            if f is not None:
                (p.work / f.args[0]).write_text(b.source())
        p.run(todo)
    finally:
        p.close()
    return p


RUNNABLE = sorted({b.page for b in ALL if b.runs})


@pytest.mark.slow
@pytest.mark.parametrize("page", RUNNABLE, ids=[p.name for p in RUNNABLE])
def test_the_page_runs_as_written(page, tmp_path):
    t0 = time.monotonic()
    p = run_page(page, tmp_path)
    took = time.monotonic() - t0
    print(f"{page.name}: {took:.1f} s; " + ", ".join(f"{w.split(':')[-1]}: {s:.1f} s" for w, s in p.timings))
    assert not p.failures, "\n".join(p.failures)
