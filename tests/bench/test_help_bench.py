"""The exit-code sections of bench, demo and experiment help, and --sim only where it means something
(issue 17, item 8)."""

from __future__ import annotations

import re

import pytest

from gpuslate.cli.main import main


def help_text(words: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as ei:
        main([*words, "--help"])
    assert ei.value.code == 0
    return " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("words", [["bench"], ["demo"], ["experiment"], ["experiment", "run"],
                                   ["experiment", "report"]], ids=" ".join)
def test_exit_codes_in_help(words: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    text = help_text(words, capsys)
    m = re.search(r"exit status: (.*?) \(see README\.md, Exit codes\)", text)
    assert m, text[-300:]
    codes = [int(c) for c in re.findall(r"(?:^|; )(\d+) ", m.group(1))]
    assert codes == sorted(codes) and 0 in codes and 2 in codes, m.group(1)
    if words != ["experiment", "report"]:
        assert 130 in codes and 143 in codes, m.group(1)


@pytest.mark.parametrize(("words", "offered"), [(["bench"], False), (["experiment", "report"], False),
                                                (["experiment", "run"], True), (["demo"], True)], ids=str)
def test_sim_offered_only_where_it_means_something(words: list[str], offered: bool,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert ("--sim DIR" in help_text(words, capsys)) == offered
