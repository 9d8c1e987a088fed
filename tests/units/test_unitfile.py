"""``gpuslate config``: the unit file checked and printed resolved (as ``docker compose config``), its
TOML reading back as the same units, its document read back field by field."""

from __future__ import annotations

import json

import pytest

from gpuslate.errors import BadDocument
from gpuslate.units.spec import load_config, resolve
from gpuslate.units.unitfile import ConfigResult, resolved, toml_text
from helpers import run_cli

FILE = """\
[units.baseline]
command = ["python", "-m", "sglang.launch_server", "--port", "30000"]
gpus = "0-7"
port = 30000
engine = "sglang"
start_timeout = "15m"
grace = "1m30s"
env = { SGLANG_LOG_LEVEL = "info", "A.B" = "x\\u007fy" }

[units."spec.x"]
command = "python -m sglang.launch_server --port 30000 --speculative-algorithm EAGLE3"
port = 30000
cwd = "."
prefetch = []
front = 8080
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "gpuslate.toml").write_text(FILE)
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")  # found in the folder above, as up finds it
    monkeypatch.delenv("GPUSLATE_CONFIG", raising=False)
    return tmp_path


def test_every_unit_resolved_as_up_resolves_it(project):
    result = resolved()
    assert result.path == str(project / "gpuslate.toml")
    assert [u.name for u in result.units] == ["baseline", "spec.x"]
    base, spec = result.units
    assert base == resolve("baseline", config=project / "gpuslate.toml")
    assert base.start_timeout == 900.0 and base.grace == 90.0  # durations with units, resolved to seconds
    assert spec.cwd == str(project) and spec.gpus is None and spec.front == "127.0.0.1:8080"


def test_the_toml_reads_back_as_the_same_units(project, tmp_path):
    text = toml_text(resolved())
    out = tmp_path / "resolved.toml"
    out.write_text(text)
    assert list(load_config(out)) == ["baseline", "spec.x"]
    again = resolved(out)
    assert again.units == resolved().units
    assert "\x7f" not in text and 'gpus = "all"' in text and "prefetch = []" in text


def test_the_document_reads_back(project):
    doc = resolved().to_json()
    assert ConfigResult.from_json(doc).to_json() == doc
    bad = json.loads(json.dumps(doc))
    bad["units"][0]["port"] = 70000
    with pytest.raises(BadDocument, match="port"):
        ConfigResult.from_json(bad)
    bad["units"][0]["port"] = 1
    bad["units"][0]["env"] = {"A": 1}
    with pytest.raises(BadDocument, match="env"):
        ConfigResult.from_json(bad)


def test_the_command(project):
    r = run_cli("config")
    assert r.returncode == 0 and r.stdout.startswith(f"# {project / 'gpuslate.toml'}: 2 units"), r.stderr
    assert run_cli("config", "--units").stdout == "baseline\nspec.x\n"
    q = run_cli("config", "-q")
    assert q.returncode == 0 and q.stdout == "" and q.stderr == ""
    doc = json.loads(run_cli("config", "--json").stdout)
    assert doc["schema"] == "gpuslate.config.v1" and [u["name"] for u in doc["units"]] == ["baseline", "spec.x"]


@pytest.mark.parametrize(("tail", "needle"), [
    ('[units.c]\ncommand = "x"\nport = 1\ngrace = "5x"\n', "gpuslate.toml:20: grace in [units.c]: invalid grace '5x'"),
    ('[units.c]\nport = 1\n', "unit 'c' has no command"),
    ('[units.c]\ncommand = "x"\ncwd = "nope"\nport = 1\n', "nope"),
    ('[units.c]\ncommand = "x"\n', "needs a port"),
])
def test_a_mistake_is_one_line_with_its_file_and_exit_2(project, tail, needle):
    (project / "gpuslate.toml").write_text(FILE + "\n" + tail)
    r = run_cli("config", "-q")
    assert r.returncode == 2 and r.stdout == "", r.stdout
    assert needle in r.stderr.splitlines()[0] and str(project / "gpuslate.toml") in r.stderr, r.stderr


def test_no_unit_file_is_exit_2(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GPUSLATE_CONFIG", raising=False)
    r = run_cli("config")
    assert r.returncode == 2 and r.stderr.startswith("gpuslate: error: no unit file"), r.stderr
