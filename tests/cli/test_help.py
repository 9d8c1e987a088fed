"""Help for people: every command states its exit codes, options are described,
sizes are SIZE everywhere, and the README's defaults are the parser's."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from gpuslate.cli.commands import common
from gpuslate.cli.main import build_parser, main

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
COMMANDS = [["status"], ["clear"], ["wait"], ["up"], ["down"], ["restart"], ["rm"], ["ps"], ["logs"], ["swap"],
            ["audit"], ["log"],
            ["sim"], ["sim", "init"], ["sim", "hold"], ["sim", "mps"], ["sim", "leak"], ["sim", "serve"]]


def subparser(words: list[str]) -> argparse.ArgumentParser:
    parser = build_parser(words)
    for word in words:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
        build = getattr(parser, "lazy_build", None)
        if build:
            parser.lazy_build = None
            build(parser)
    return parser


def help_of(words: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as ei:
        main([*words, "--help"])
    assert ei.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("words", COMMANDS + [[]], ids=lambda w: " ".join(w) or "gpuslate")
def test_every_help_states_its_exit_codes(words, capsys):
    text = " ".join(help_of(words, capsys).split())
    m = re.search(r"exit status: (.*?) \(see README\.md, Exit codes\)", text)
    assert m, text[-400:]
    codes = [int(c) for c in re.findall(r"(?:^|; )(\d+) ", m.group(1))]
    assert codes == sorted(codes) and 0 in codes and 2 in codes and 130 in codes, m.group(1)


def test_top_level_help_lists_every_command_and_sim_serve(capsys):
    text = help_of([], capsys)
    for name in ("status", "clear", "wait", "up", "down", "ps", "logs", "swap", "audit", "sim"):
        assert re.search(rf"^    {name} ", text, re.M), name
    flat = " ".join(text.split())  # help lines wrap anywhere
    assert "sim serve" in flat and "sim init" in flat and "sim leak" in flat
    assert not re.search(r"^    log ", text, re.M)  # the old name is hidden


@pytest.mark.parametrize("words", COMMANDS, ids=" ".join)
def test_every_option_is_described_and_sizes_are_SIZE(words):
    parser = subparser(words)
    assert parser.description, words
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        assert action.help, (words, action.option_strings)
        if action.type is common.size:
            assert action.metavar == "SIZE", (words, action.option_strings)


def test_sim_init_count_and_its_hidden_alias(tmp_path, capsys):
    assert main(["sim", "init", str(tmp_path / "a"), "--count", "3", "--json"]) == 0
    assert '"gpus": 3' in capsys.readouterr().out
    assert main(["sim", "init", str(tmp_path / "b"), "--gpus", "2", "--json"]) == 0  # scripts of before
    assert '"gpus": 2' in capsys.readouterr().out
    assert "--gpus" not in help_of(["sim", "init"], capsys)


ROWS = {"status": ["status"], "clear": ["clear"], "wait": ["wait", "--free"], "audit": ["audit"],
        "sim init": ["sim", "init", "DIR"], "sim hold": ["sim", "hold", "--memory", "1GiB"]}


@pytest.mark.parametrize("command", sorted(ROWS))
def test_readme_defaults_are_the_parsers(command):
    row = next(line for line in README.splitlines() if line.startswith(f"| `{command} "))
    usage = row.split("`")[1]
    shown = re.findall(r"\[(--[a-z-]+) ([^\]\s|]+)\]", usage)
    words = ROWS[command]
    parser = build_parser(words)
    for option, value in shown:
        if value.isupper():  # a metavar (SIZE, LIST), not a default
            continue
        default = parser.parse_args(words)
        given = parser.parse_args([*words, option, value])
        dest = option.lstrip("-").replace("-", "_")
        assert getattr(default, dest) == getattr(given, dest), (command, option, value, getattr(default, dest))
    assert shown or command in ("status",), row


def test_gpu_lists_print_one_way():
    from gpuslate._parse import format_gpu_list
    from gpuslate.cli.render.units import gpu_text

    assert gpu_text([0, 1, 2, 5, 7, 8]) == format_gpu_list([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert gpu_text([]) == "-"
    # in a sentence: GPU 3, GPUs 0-1 (never "GPU 0,1", "GPUs 3")
    from gpuslate._parse import gpus_phrase

    assert (gpus_phrase([3]), gpus_phrase([1, 0]), gpus_phrase([0, 1, 2, 5]), gpus_phrase([])) == (
        "GPU 3", "GPUs 0-1", "GPUs 0-2,5", "no GPU")


def test_demo_says_it_runs_on_a_temporary_host_not_gpuslate_sim(capsys):
    """The demo clears every GPU of its host: it never takes $GPUSLATE_SIM, and its --help says so."""
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--sim DIR run on the simulated host in DIR (default: a new one in a temporary folder, never " \
           "$GPUSLATE_SIM" in text


def every_parser(parser: argparse.ArgumentParser | None = None, path: tuple[str, ...] = ()):
    """Every command's and subcommand's parser (its options built), with its words."""
    parser = parser or build_parser()
    build = getattr(parser, "lazy_build", None)
    if build:
        parser.lazy_build = None
        build(parser)
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for word, sub in action.choices.items():
                yield from every_parser(sub, (*path, word))


def examples_of(text: str) -> list[str]:
    """The commands of a help's ``examples:`` block (its comment lines left out)."""
    block = text.split("\nexamples:\n", 1)[1].split("\n\n", 1)[0]
    return [line.strip() for line in block.splitlines() if not line.strip().startswith("#")]


PARSERS = {" ".join(path): p for path, p in every_parser() if path}


@pytest.mark.parametrize("words", sorted(PARSERS))
def test_every_help_has_examples_that_parse(words):
    """Every command and subcommand ends its --help with examples (a verb's from its declaration), each
    a command gpuslate's own parser takes as written; and says what a SIZE and a DURATION are where it
    takes one."""
    import shlex

    from gpuslate.cli.fleet import split_fleet_options

    text = PARSERS[words].format_help()
    assert "\nexamples:\n" in text, words
    found = examples_of(text)
    assert found and all(e.startswith("gpuslate ") for e in found), found
    for example in found:
        _, argv = split_fleet_options(shlex.split(example)[1:])
        try:
            build_parser(argv).parse_args(argv)
        except SystemExit as exc:
            raise AssertionError(f"{words}: its example does not parse: {example}") from exc
    metavars = {a.metavar for a in PARSERS[words]._actions}
    for metavar in ("SIZE", "DURATION"):
        assert (f"\n  {metavar}  " in text) == (metavar in metavars), (words, metavar)
