"""The command table (cli/commands/__init__.py) is the one list of commands: every row's strings
import and resolve, each result type reads the documents of its row's name (and no other), every
command word argparse knows has a row, real documents are shown through it, no command module
picks an exit number itself, and cli/ holds only what the layout says."""

from __future__ import annotations

import argparse
import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpuslate.cli.commands import COMMANDS, document_for, documents, load
from gpuslate.cli.main import build_parser
from gpuslate.errors import BadDocument
from helpers import gpuslate_env

CLI = Path(__file__).resolve().parents[2] / "src" / "gpuslate" / "cli"


@pytest.mark.parametrize("word", list(COMMANDS))
def test_every_row_resolves(word):
    row = COMMANDS[word]
    # a verb's module runs it (its options are its declaration's); another command's builds its parser too
    assert callable(load(f"gpuslate.cli.commands.{row.module}:{'run' if row.verb is not None else 'build'}"))
    assert row.summary or word == "log"  # the line of gpuslate --help (log, the old name, is hidden)
    if row.verb is not None:  # the verb's document is the row's
        assert row.verb.result == row.document.result
    shown = ([(word, row.document)] if row.document is not None else []) + list(row.also)
    assert shown or word in ("exporter", "completion")  # the two without a document
    for name, doc in shown:
        cls = load(doc.result)
        assert callable(cls.from_json) and callable(load(doc.render))
        assert doc.story is None or callable(load(doc.story))
        # the type reads gpuslate.NAME.v1 (this empty one is malformed, not of another schema)...
        with pytest.raises(BadDocument, match=f"malformed gpuslate.{name}.v1 document"):
            cls.from_json({"schema": f"gpuslate.{name}.v1"})
        # ...and not another row's
        with pytest.raises(BadDocument) as other:
            cls.from_json({"schema": "gpuslate.nosuch.v1"})
        assert "malformed" not in str(other.value)


def test_every_command_word_argparse_knows_has_a_row():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == set(COMMANDS)
    assert [a.dest for a in sub._choices_actions] == [w for w in COMMANDS if w != "log"]  # help order; log hidden


def test_a_document_is_found_by_its_schema_only():
    assert document_for("gpuslate.sim.leak.v1") is dict(COMMANDS["sim"].also)["sim.leak"]
    assert document_for("gpuslate.batch.v1") is dict(COMMANDS["up"].also)["batch"]
    assert document_for("gpuslate.log.v1") is document_for("gpuslate.audit.v1") is not None
    for schema in (None, 3, "gpuslate.fleet.v1", "gpuslate.sim.v1", "other.status.v1", "gpuslate.nosuch.v1"):
        assert document_for(schema) is None
    assert len(documents()) == 24  # 19 commands' own (log and config included), sim.init, sim.leak, batch, logs.many


def test_real_documents_read_back_through_the_table(tmp_path):
    """Documents of real runs (a simulated host): the row of their schema reads each back as it was."""
    env = gpuslate_env({"GPUSLATE_STATE_DIR": str(tmp_path / "state"), "GPUSLATE_LOCK_DIR": str(tmp_path / "l")})
    sim = str(tmp_path / "sim")
    import json

    runs = [["sim", "init", sim, "--gpus", "2"], ["--sim", sim, "sim", "leak", "--gpu", "0", "--memory", "1GiB"],
            ["--sim", sim, "status"], ["--sim", sim, "clear", "--dry-run"], ["--sim", sim, "ps"],
            ["--sim", sim, "log"], ["--sim", sim, "wait", "--free", "--timeout", "0"]]
    seen = []
    for words in runs:
        r = subprocess.run([sys.executable, "-m", "gpuslate", *words, "--json"], capture_output=True, text=True,
                           env=env, timeout=60)
        doc = json.loads(r.stdout)
        row = document_for(doc["schema"])
        assert row is not None, doc["schema"]
        assert row.read(doc).to_json() == doc
        seen.append(doc["schema"])
    assert seen == ["gpuslate.sim.init.v1", "gpuslate.sim.leak.v1", "gpuslate.status.v1", "gpuslate.clear.v1",
                    "gpuslate.ps.v1", "gpuslate.log.v1", "gpuslate.wait.v1"]


def _bare_numbers(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Return) or node.value is None:
            continue
        v = node.value
        if isinstance(v, ast.Constant) and isinstance(v.value, int) and not isinstance(v.value, bool):
            found.append(f"{path.name}:{node.lineno}: return {v.value}")
        elif isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "int":
            found.append(f"{path.name}:{node.lineno}: return int(...)")
    return found


def test_no_command_module_returns_a_bare_number():
    """Exit codes come from cli/exits.py (present(), an ExitStatus member): never a number picked here."""
    found = [f for p in sorted((CLI / "commands").glob("*.py")) for f in _bare_numbers(p)]
    assert found == []


def test_the_check_finds_a_bare_number(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def run(args):\n    if args:\n        return 0\n    return int(args.code)\n")
    assert sorted(_bare_numbers(bad)) == ["bad.py:3: return 0", "bad.py:4: return int(...)"]


def test_cli_holds_only_its_layout():
    entries = {p.name for p in CLI.iterdir() if p.name != "__pycache__"}
    assert entries == {"__init__.py", "main.py", "exits.py", "fleet.py", "commands", "render"}


def _modules_after(*argv: str) -> set[str]:
    """The gpuslate modules a fresh ``gpuslate ARGV`` imported (its output thrown away)."""
    code = ("import sys, io, contextlib\nfrom gpuslate.cli.main import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n        main(sys.argv[1:])\n    except SystemExit:\n        pass\n"
            "print(' '.join(m for m in sys.modules if m.startswith('gpuslate.')))")
    r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=gpuslate_env(),
                       timeout=60, check=True)
    return set(r.stdout.split())


def test_help_and_completion_import_no_command_module():
    """The summaries are in the table and a verb's options in its declaration (pip's commands_dict):
    ``--help``, a verb's ``--help`` and completion import no command's module (completion imports the
    modules of the commands that are no verb, which build their own options, and its own)."""
    verb_modules = {f"gpuslate.cli.commands.{row.module}" for row in COMMANDS.values() if row.verb is not None}
    shared = {"gpuslate.cli.commands", "gpuslate.cli.commands.common"}
    for argv in (["--help"], ["clear", "--help"], ["up", "--help"], ["log", "--help"]):
        loaded = {m for m in _modules_after(*argv) if m.startswith("gpuslate.cli.commands")}
        assert loaded == shared, (argv, loaded)
    loaded = _modules_after("completion", "bash")
    assert not loaded & verb_modules, loaded & verb_modules
    assert not any(m.startswith(("gpuslate.clearing", "gpuslate.api")) for m in loaded), sorted(loaded)


def test_each_commands_help_lists_the_exit_code_of_every_status_it_can_end_with():
    """The help's exit codes (a verb's row's ``exits``, another command's epilog, and the common ones)
    name the code of every member of the command's status enum (its outcome's, cli/exits.py): a
    member added with a new outcome, or a code dropped from the help, fails here, not in a user's
    script. (``experiment``'s report has several enums, one per subcommand: not checked here.)"""
    from gpuslate.cli.exits import _BY_OUTCOME

    checked = []
    for word, row in COMMANDS.items():
        if row.document is None:
            continue
        result = load(row.document.result)  # ClearResult -> ClearStatus, AuditListing -> AuditStatus ...
        name = f"{result.__name__.removesuffix('Result').removesuffix('Listing')}Status"
        enum = getattr(importlib.import_module(result.__module__), name, None)
        if enum is None:
            continue
        parser = build_parser([word])
        p = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[word]
        p.lazy_build(p)
        listed = {int(c) for c in re.findall(r"(?:: |; )(\d+) ", " ".join(p.epilog.split()))}
        codes = {int(_BY_OUTCOME[m.outcome]) for m in enum}
        assert codes <= listed, (word, sorted(codes - listed))
        checked.append(word)
    assert {"clear", "up", "swap", "slurm", "bench", "install"} <= set(checked), checked
