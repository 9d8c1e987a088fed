"""``gpuslate.Host`` and ``gpuslate.RemoteHost`` as a type checker sees them: every verb typed, the
same signatures on both (the :class:`~gpuslate.verbs.Verbs` Protocol).

A caller's mistake that the old ``importlib`` dispatch let through (``Any``), such as
``host.clear(options, selection)`` with the two swapped, is what mypy must now reject, on
either class; a correct call through the Protocol must pass, so each check can fail both ways.
The snippets are written to a temporary folder and checked by the project's mypy with the
project's config, against this checkout's ``src/`` (``MYPYPATH``), in one run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SNIPPETS = {
    "swapped_local": """
        from gpuslate import ClearOptions, Host, Selection

        with Host.open() as host:
            host.clear(ClearOptions(), Selection())
            host.swap("a", 3)
        """,
    "swapped_remote": """
        from gpuslate import ClearOptions, RemoteHost, Selection

        host = RemoteHost("h1")
        host.clear(ClearOptions(), Selection())
        host.swap("a", 3)
        """,
    "correct": """
        from gpuslate import AuditOptions, ClearOptions, Host, LogsOptions, RemoteHost, Selection, UnitSpec
        from gpuslate.host.auditlist import AuditListing
        from gpuslate.units.logfile import LogsResult
        from gpuslate.verbs import Verbs


        def drive(host: Verbs) -> None:
            host.clear(Selection(gpus=(0,)), ClearOptions(grace=5))
            host.swap("a", "b")
            host.swap("a", UnitSpec("b", command=["serve"]))
            host.up("a")
            host.up(UnitSpec("u", command=["serve"]))
            host.status([0], full=False)
            listing: AuditListing = host.audit(AuditOptions(limit=5))
            lines: LogsResult = host.logs("a", LogsOptions(tail=10))


        drive(Host.open())
        drive(RemoteHost("h1"))
        """,
}


@pytest.fixture(scope="module")
def mypy_errors(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Each snippet's mypy errors, as ``LINE: MESSAGE`` (one mypy run for all of them)."""
    folder = tmp_path_factory.mktemp("snippets")
    paths = []
    for name, text in SNIPPETS.items():
        path = folder / f"{name}.py"
        path.write_text(textwrap.dedent(text).lstrip("\n"))
        paths.append(str(path))
    env = {**os.environ, "MYPYPATH": str(ROOT / "src")}  # this checkout, not an installed copy
    r = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                        "--no-incremental", "--follow-imports=silent", "--no-error-summary", *paths],
                       capture_output=True, text=True, env=env, cwd=folder, timeout=120, check=False)
    found: dict[str, list[str]] = {name: [] for name in SNIPPETS}
    for line in r.stdout.splitlines():
        m = re.match(r".*?([A-Za-z_]+)\.py:(\d+): error: (.*)", line)
        if m and m.group(1) in found:
            found[m.group(1)].append(f"{m.group(2)}: {m.group(3)}")
    assert r.returncode in (0, 1) and (r.returncode == 1) == any(found.values()), r.stdout + r.stderr
    return found


@pytest.mark.parametrize(("snippet", "cls"), [("swapped_local", "Host"), ("swapped_remote", "RemoteHost")])
def test_swapped_or_wrong_arguments_are_type_errors_on_both_hosts(mypy_errors, snippet, cls):
    errors, first = mypy_errors[snippet], 4  # the line of clear(...), then swap(...)
    assert f'{first}: Argument 1 to "clear" of "{cls}" has incompatible type "ClearOptions"; ' \
           'expected "Selection | None"  [arg-type]' in errors, errors
    assert any(e.startswith(f'{first}: Argument 2 to "clear" of "{cls}" has incompatible type "Selection"')
               for e in errors), errors
    assert f'{first + 1}: Argument 2 to "swap" of "{cls}" has incompatible type "int"; ' \
           'expected "str | UnitSpec"  [arg-type]' in errors, errors
    assert len(errors) == 3, errors


def test_every_verb_called_right_through_the_protocol_passes_for_both_hosts(mypy_errors):
    assert mypy_errors["correct"] == []
