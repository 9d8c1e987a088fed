"""Where the unit file comes from, as docker compose finds its compose file: ``--config``, else
``$GPUSLATE_CONFIG`` (compose's ``COMPOSE_FILE``), else ``gpuslate.toml`` in the current folder
or the nearest folder above it; a file found by that walk that someone else could have put there
is refused, never used and never skipped."""

from __future__ import annotations

import json
import os
import sys

import pytest

from gpuslate.errors import PermissionDenied, UsageError
from gpuslate.units.spec import find_config
from helpers import is_gone

NOBODY = 65534


def unit_file(path, name: str = "web", gpu: int = 0) -> None:
    cmd = [sys.executable, "-m", "gpuslate", "sim", "hold", "--gpus", str(gpu), "--memory", "1GiB"]
    path.write_text(f'[units.{name}]\ncommand = {json.dumps(cmd)}\ngpus = "{gpu}"\nready_log = "ready"\n'
                    "start_timeout = 30\ngrace = 2\n")
    path.chmod(0o644)


def test_up_from_a_subfolder_finds_the_file_above(units_host, units, tmp_path):
    unit_file(tmp_path / "gpuslate.toml")
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    r = units("up", "web", "--json", cwd=str(deep))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["status"] == "ready" and doc["gpus"] == [0] and doc["command"][-4:] == ["--gpus", "0", "--memory",
                                                                                        "1GiB"]
    r = units("down", "web", "--json", cwd=str(deep))
    assert r.returncode == 0, r.stderr
    assert is_gone(doc["pid"])


def test_the_nearest_file_wins_and_the_variable_and_the_option_come_first(units_host, tmp_path, monkeypatch):
    unit_file(tmp_path / "gpuslate.toml")
    (tmp_path / "a").mkdir()
    unit_file(tmp_path / "a" / "gpuslate.toml", gpu=1)
    unit_file(tmp_path / "named.toml", gpu=2)
    monkeypatch.chdir(tmp_path / "a")
    assert find_config() == tmp_path / "a" / "gpuslate.toml"
    monkeypatch.setenv("GPUSLATE_CONFIG", str(tmp_path / "named.toml"))
    assert find_config() == tmp_path / "named.toml"
    assert find_config(tmp_path / "gpuslate.toml") == tmp_path / "gpuslate.toml"  # --config
    monkeypatch.setenv("GPUSLATE_CONFIG", "named.toml")  # relative: to the current folder, as COMPOSE_FILE
    with pytest.raises(UsageError, match=r"GPUSLATE_CONFIG names named\.toml, which is not a file"):
        find_config()
    monkeypatch.setenv("GPUSLATE_CONFIG", f"{tmp_path / 'named.toml'}:{tmp_path / 'gpuslate.toml'}")
    with pytest.raises(UsageError, match="a list such as COMPOSE_FILE's is not read"):
        find_config()


def test_a_missing_variable_file_is_one_line_and_nothing_starts(units_host, units, tmp_path):
    r = units("up", "web", cwd=str(tmp_path), env={"GPUSLATE_CONFIG": str(tmp_path / "nope.toml")})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.splitlines()[0] == f"gpuslate: error: GPUSLATE_CONFIG names {tmp_path / 'nope.toml'}, " \
                                       "which is not a file"
    assert not list((tmp_path / "state").glob("units/*.json"))


def test_without_any_file_the_message_says_where_it_looked(units_host, units, tmp_path):
    r = units("up", "web", cwd=str(tmp_path))
    assert r.returncode == 2
    assert "no gpuslate.toml here or above, and no GPUSLATE_CONFIG" in r.stderr


@pytest.mark.parametrize("how", ["writable by others", "another user's"])
def test_a_file_found_above_that_others_could_plant_is_refused(units_host, units, tmp_path, how):
    if how == "another user's" and os.geteuid() != 0:
        pytest.skip("needs root to give the file to another user")
    unit_file(tmp_path / "gpuslate.toml")
    if how == "writable by others":
        (tmp_path / "gpuslate.toml").chmod(0o666)
    else:
        os.chown(tmp_path / "gpuslate.toml", NOBODY, -1)
    (tmp_path / "sub").mkdir()
    with pytest.raises(PermissionDenied, match="refusing the unit file"):
        os.chdir(tmp_path / "sub")
        try:
            find_config()
        finally:
            os.chdir(tmp_path)
    r = units("up", "web", cwd=str(tmp_path / "sub"))
    assert r.returncode == 5 and "Traceback" not in r.stderr, r.stderr
    assert "refusing the unit file" in r.stderr and "--config PATH or GPUSLATE_CONFIG" in r.stderr
    assert not list((tmp_path / "state").glob("units/*.json"))  # nothing launched
    if how == "writable by others":  # named by the user, the same file is theirs to use
        r = units("up", "web", "--config", str(tmp_path / "gpuslate.toml"), cwd=str(tmp_path / "sub"))
        assert r.returncode == 0, r.stderr
        assert units("down", "web").returncode == 0
