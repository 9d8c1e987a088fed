"""The test suite's own rules: it mirrors src/, the slow marker is used and skippable, and CI runs
exactly the README's command (lint, types, tests).

These read the tree and pytest's own collection (a subprocess, ``--collect-only``): a test moved to
the root, a slow file left unmarked or a README command that drifted from ``.ci/run`` fails here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
PACKAGE = ROOT / "src" / "gpuslate"

#: test folders that hold helpers shared by several folders, not the tests of one package
KITS = {"fuzzkit"}
#: root test files that check the whole package or the suite, not one module (test_docs_run.py: README.md and docs/ run
#: as written; test_leakcheck.py: the check that every test ends the processes it starts)
PACKAGE_WIDE = {"test_import_graph.py", "test_suite_rules.py", "test_docs_run.py", "test_leakcheck.py"}
#: files whose every test is slow (daemons, fuzzers, whole runs): each must carry the marker
SLOW_FILES = {
    "tests/clearing/test_fuzz_forests.py", "tests/slurm/test_slurm_cluster.py", "tests/exporter/test_prometheus.py",
    "tests/remote/test_remote_cli.py", "tests/remote/test_install.py", "tests/bench/test_demo.py",
    "tests/bench/test_experiment.py", "tests/bench/test_drift.py", "tests/bench/test_engine_experiment.py",
}

#: a pytest plugin for the collecting subprocess: every test with its markers before ``-m`` deselects
#: any, and the tests that ``-m`` kept
_PLUGIN = """
import json, os, pytest

_all = {}

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    _all.update({i.nodeid: sorted({m.name for m in i.iter_markers()}) for i in items})

def pytest_collection_finish(session):
    with open(os.environ["GPUSLATE_TEST_MARKS"], "w") as f:
        json.dump({"all": _all, "selected": [i.nodeid for i in session.items]}, f)
"""


class Collection(NamedTuple):
    marks: dict[str, set[str]]  # every test (the gpu ones too) -> its markers
    quick: set[str]  # what -m "not gpu and not slow" (the README's quick subset) selects

    def having(self, mark: str) -> set[str]:
        return {t for t, ms in self.marks.items() if mark in ms}


@pytest.fixture(scope="module")
def collection(tmp_path_factory: pytest.TempPathFactory) -> Collection:
    """One ``--collect-only`` of the whole suite with the README's quick-subset ``-m``; nothing runs."""
    d = tmp_path_factory.mktemp("collect")
    (d / "gpuslate_marks_plugin.py").write_text(_PLUGIN)
    out = d / "marks.json"
    env = {**os.environ, "GPUSLATE_TEST_MARKS": str(out), "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(d), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                        "-p", "gpuslate_marks_plugin", "-m", "not gpu and not slow"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads(out.read_text())
    return Collection({t: set(ms) for t, ms in doc["all"].items()}, set(doc["selected"]))


def test_root_holds_only_package_wide_checks_and_top_level_modules() -> None:
    """A root test file tests a top-level module (tests/test_parse.py: gpuslate/_parse.py) or the
    whole package; everything else lives in the folder of the package it tests."""
    top_level = {p.stem.lstrip("_") for p in PACKAGE.glob("*.py")}
    for f in sorted(TESTS.glob("test_*.py")):
        assert f.name in PACKAGE_WIDE or f.stem.removeprefix("test_") in top_level, \
            f"{f.relative_to(ROOT)}: move it to the tests/ folder of the package it tests"


def test_every_test_folder_is_a_package_of_src() -> None:
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    for d in sorted(p for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))):
        assert d.name in packages | KITS, f"tests/{d.name}/ mirrors no package of src/gpuslate"


def test_the_slow_marker_is_used_and_the_quick_subset_excludes_it(collection: Collection) -> None:
    slow, gpu = collection.having("slow"), collection.having("gpu")
    assert len(slow) >= 20, f"only {len(slow)} tests are marked slow"
    assert gpu, "the gpu tests were not collected"
    # the README's -m "not gpu and not slow" replaces addopts' -m 'not gpu' and still leaves out both
    assert collection.quick == set(collection.marks) - slow - gpu
    assert len(collection.quick) > 2 * len(slow)  # most of the suite stays in the quick subset


def test_known_slow_files_are_marked_whole(collection: Collection) -> None:
    for f in sorted(SLOW_FILES):
        assert (ROOT / f).is_file(), f
        in_file = {t for t in collection.marks if t.startswith(f + "::")}
        assert in_file and in_file <= collection.having("slow"), f"{f}: mark the whole file slow (pytestmark)"


def test_ci_runs_the_readme_command_lint_and_types_first() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    m = re.search(r"^# 2\. .*\n(python3 -m venv .*)$", readme, re.M)
    assert m, "README quick start command 2 not found"
    command = m.group(1)
    assert command in ci.splitlines(), ".ci/run must run the README's command 2 verbatim"
    steps = command.split(" && ")
    assert steps.index(".venv/bin/ruff check") < steps.index(".venv/bin/mypy") < steps.index(
        '.venv/bin/python -m pytest -n 4 --dist loadfile -m "not gpu and not timing"') < steps.index(
        '.venv/bin/python -m pytest -m "timing and not gpu"')


def test_the_readme_quick_start_figures_are_the_last_measured() -> None:
    """README's quick-start command 1 says how long it takes: the figures of the last measurement in
    benchmarks/RESULTS.md (a claim that drifted from it, "under a minute" when it took 2 min 25 s,
    fails here), each within 5 s."""
    readme = (ROOT / "README.md").read_text()
    results = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    said = re.search(r"^#    \(about a minute on 2 cores: the install (\d+) s .*\n#.*the demo (\d+) s;", readme, re.M)
    assert said, "README quick start command 1's timing comment not found"
    runs = re.findall(r"\*\*Quick-start command 1\*\*.*?(\d+) s in all, the\s+install (\d+) s.*?`demo --quick` (\d+) s",
                      results, re.S)
    assert runs, "no quick-start measurement in benchmarks/RESULTS.md"
    total, install, demo = (int(x) for x in runs[-1])
    assert abs(int(said.group(1)) - install) <= 5 and abs(int(said.group(2)) - demo) <= 5, (said.groups(), runs[-1])
    assert total <= 75, "README says about a minute"
