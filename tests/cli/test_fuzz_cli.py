"""Every command with generated hostile arguments: a documented exit code, never a
traceback, and a canary holder on another simulated host never signaled.

Commands run in-process through ``main(argv)`` (fast enough for a few hundred
examples); what would run for ever (``status --watch``, ``logs --follow``,
``sim hold``, ``sim serve``, ``up ... -- COMMAND``) is kept out of the vocabulary,
and random words never start with '-' (argparse would take ``--w`` for ``--watch``);
the fleet options (``-H/--host``, ``--hosts``) are left out: this test stays on this host.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuslate.cli.main import main
from gpuslate.gpu.simhost.host import SimHost
from helpers import GiB, is_gone

DOCUMENTED = {0, 2, 3, 4, 5, 6, 7, 130}
COMMANDS = [["status"], ["clear"], ["clear", "--yes"], ["clear", "--dry-run"], ["wait", "--free"], ["wait"],
            ["up", "web"], ["up"], ["down", "web"], ["down"], ["ps"], ["logs", "web"], ["swap", "a", "b"], ["audit"],
            ["log"], ["sim"], ["sim", "init", "new"], ["sim", "leak", "--gpu", "1", "--memory", "1GiB"], []]
NUMBERS = ["0", "0.05", "-1", "nan", "inf", "-inf", "1e300", "", " ", "\uff11", "\u0663", "1_0", "0x10", "9" * 400,
           "1" + "0" * 30, "１GiB", "40XB", "1.5GB", "0-99999999999", "0,,1", "3-1", "0-7", "7", "\x00", "\x1b[2J"]
OPTIONS = ["--gpus", "--pid", "--user", "--match", "--all-users", "--include-handles", "--grace", "--timeout",
           "--max-used", "--dry-run", "--yes", "--json", "--limit", "--tail", "--port", "--ready-host", "--ready",
           "--ready-log", "--engine", "--cwd", "--env", "--containment", "--start-timeout", "--stop-timeout",
           "--config", "--rollback", "--memory", "--count", "--memory-api", "--reserved", "--release-delay",
           "--gpu", "--name", "--sim", "--smoke", "--model", "--help", "--version", "--bogus"]
TEXT = ["(", "[", "*", "nobody", "root", "no-such-user", "http://[::1", "999.1.1.1", "ftp://x", "/etc/passwd",
        "A=1", "=", "sglang", "tgi", "cgroup", "v1", "v3", "..", "web", "a" * 300, "\u202e", "\x9b31m"]


@pytest.fixture
def arena(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hold):
    """A host to fuzz on, paths good and bad, and a canary holding GPU 0 of *another* host."""
    fuzz = SimHost.init(tmp_path / "fuzz", gpus=2, memory=8 * GiB, release_delay=0.05)
    canary_host = SimHost.init(tmp_path / "canary", gpus=1, memory=8 * GiB)
    canary = hold("--gpus", "0", "--memory", "1GiB", host=canary_host)
    (tmp_path / "afile").write_text("x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "host.json").write_text('{"schema": "gpuslate.simhost.v1", "gpus": -1}')
    tomls = []
    for i, body in enumerate(['command = "sleep \\"5"', "env = {A = [1, 2]}", "grace = -5", "port = 0",
                              "[[units]]", "units = 3", 'command = ["a", 1]', "bogus = 1"]):
        f = tmp_path / f"bad{i}.toml"
        f.write_text(f"[units.web]\n{body}\n" if "units" not in body else body + "\n")
        tomls.append(str(f))
    monkeypatch.setenv("GPUSLATE_SIM", str(fuzz.root))
    monkeypatch.setenv("GPUSLATE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("GPUSLATE_LOCK_DIR", raising=False)
    monkeypatch.chdir(tmp_path)  # no gpuslate.toml here
    paths = [str(fuzz.root), str(tmp_path / "afile"), str(tmp_path / "full"), str(tmp_path / "broken"),
             str(tmp_path / "new"), str(tmp_path / "nowhere" / "deep"), *tomls]
    return canary, paths  # paths[0]: the fuzzed host


GOOD = ["0", "1", "0-1", "0.05", "1GiB", "64MiB", "web", "2", "127.0.0.1", "::1", "/health", "sglang", "v1"]


def own_options(command: list[str]) -> tuple[list[str], list[str]]:
    """The options of the command's parser that take a value, and its flags (unsafe ones
    left out, see the module doc)."""
    import argparse

    from gpuslate.cli.main import build_parser

    parser = build_parser(command or ["status"])
    for word in command:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if sub is None or word not in sub.choices:
            break
        parser = sub.choices[word]
        build = getattr(parser, "lazy_build", None)
        if build:
            parser.lazy_build = None
            build(parser)
    # --host/--hosts would reach out to other machines (this test stays on this one)
    unsafe = {"--watch", "--follow", "--help", "--version", "--host", "--hosts", "--group", "--parallel"}
    valued = {o for a in parser._actions if a.nargs != 0 for o in a.option_strings if o.startswith("--")}
    flags = {o for a in parser._actions if a.nargs == 0 for o in a.option_strings if o.startswith("--")}
    return sorted(valued - unsafe), sorted(flags - unsafe)


def words(paths: list[str], canary_pid: int, options: tuple[list[str], list[str]]) -> st.SearchStrategy[list[str]]:
    """Loose words, and option/value pairs of the command's own options (mostly plausible
    values, so that runs get past argparse and into the commands)."""
    vocab = OPTIONS + NUMBERS + TEXT + paths + [str(canary_pid)]
    free = st.text(min_size=0, max_size=12).filter(lambda t: not t.startswith("-"))
    valued, own_flags = options
    pair = st.tuples(st.sampled_from(valued or OPTIONS),
                     st.one_of(st.sampled_from(GOOD + paths + [str(canary_pid)]), st.sampled_from(NUMBERS + TEXT)))
    flag = st.sampled_from(own_flags or ["--json"])
    pairs = pair.map(list)
    flags = flag.map(lambda w: [w])
    item = st.one_of(pairs, pairs, pairs, pairs, pairs, flags, flags,
                     st.sampled_from(vocab).map(lambda w: [w]), free.map(lambda w: [w]))
    return st.lists(item, max_size=4).map(lambda items: [w for i in items for w in i])


def test_every_command_with_hostile_arguments(arena, capsys):
    canary, paths = arena

    options = {tuple(c): own_options(c) for c in COMMANDS}

    @settings(max_examples=300, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(data=st.data(), command=st.sampled_from(COMMANDS),
           front=st.sampled_from([[], [], ["--json"], ["--sim", paths[0]], ["--sim", paths[1]], ["--sim", paths[3]],
                                  ["--sim"]]))
    def run(data: st.DataObject, command: list[str], front: list[str]) -> None:
        args = data.draw(words(paths, canary.pid, options[tuple(command)]))
        argv = [*front, *command, *args]
        # a fresh host each time: a leak (or a host re-made smaller) must not make the next
        # example's clear wait out its default 60 s
        SimHost.init(paths[0], gpus=2, memory=8 * GiB, release_delay=0.05)
        env = dict(os.environ)
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse: usage errors, --help, --version
            code = exc.code if isinstance(exc.code, int) else 2
        finally:
            os.environ.clear()
            os.environ.update(env)  # --sim exports GPUSLATE_SIM for the rest of a run
        out, err = capsys.readouterr()
        assert code in DOCUMENTED, (argv, code, err)
        assert "Traceback" not in err and "Traceback" not in out, (argv, err)
        if code == 2 and err:
            assert err.startswith("gpuslate: error: ") or err.startswith("usage:"), (argv, err)
        assert not is_gone(canary.pid), argv

    run()

