"""Only whole option names are accepted (issue 25): argparse's ``allow_abbrev`` would take any
unambiguous prefix, so ``clear --all`` meant ``--all-users`` and a root user meaning "all GPUs"
targeted other users' jobs. Proved for every long option of every command and sub-command by
walking the parser tree (lazily built options included), and end to end for the shapes found."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from gpuslate.cli.main import build_parser, main


def parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every parser of the tree with its command words; options built on first use are built."""
    build = getattr(parser, "lazy_build", None)
    if build is not None:
        parser.lazy_build = None  # type: ignore[attr-defined]
        build(parser)
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) not in seen:
                    seen.add(id(sub))
                    yield from parsers(sub, (*path, name))


def long_options(parser: argparse.ArgumentParser) -> list[str]:
    return sorted({o for a in parser._actions for o in a.option_strings if o.startswith("--") and len(o) > 3})


class Refused(Exception):
    pass


def test_every_parser_refuses_every_prefix_of_every_long_option(monkeypatch):
    tree = list(parsers(build_parser()))
    assert len(tree) >= 20, [p for p, _ in tree]  # every command and sub-command (sim serve's lazy options too)
    checked = 0
    for path, parser in tree:
        assert parser.allow_abbrev is False, path
        options = set(long_options(parser))
        for action in parser._actions:  # nothing required: the prefix alone decides what parsing does
            monkeypatch.setattr(action, "required", False)

        def refuse(message: str) -> None:
            raise Refused(message)

        monkeypatch.setattr(parser, "error", refuse)
        for option in sorted(options):
            for end in range(3, len(option)):
                prefix = option[:end]
                if prefix in options:
                    continue
                for word in (prefix, f"{prefix}=1"):
                    try:
                        _, rest = parser.parse_known_args([word])
                    except Refused as exc:  # an option taking the prefix would say so here
                        raise AssertionError(f"{' '.join(path)} {word}: {exc}") from None
                    assert rest == [word], (path, word, rest)
                    checked += 1
    assert checked > 1000


@pytest.mark.parametrize("argv,prefix", [
    (["clear", "--all", "--dry-run"], "--all"),  # was --all-users
    (["clear", "--dry", "--all-users"], "--dry"),
    (["clear", "--y", "--dry-run"], "--y"),
    (["status", "--gpu", "0"], "--gpu"),
    (["sim", "init", "--cou", "2", "DIR"], "--cou"),
    (["--ver"], "--ver"),
    (["status", "--hos", "h1"], "--hos"),
])
def test_prefixes_are_usage_errors_before_anything_runs(argv, prefix, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUSLATE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("GPUSLATE_SIM", raising=False)
    with pytest.raises(SystemExit) as ei:
        main(argv)
    assert ei.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuslate: error: unrecognized arguments: ") and prefix in err, err
    assert not (tmp_path / "state").exists()  # nothing was started: not even the state folder
