"""A relative GPUSLATE_STATE_DIR or GPUSLATE_LOCK_DIR is refused (exit 2, one line), not taken
relative to each command's folder: units recorded after one ``cd`` would vanish after the next, and
two commands in two folders would not share a lock. ``~`` is expanded."""

from __future__ import annotations

import os

import pytest


@pytest.mark.parametrize(("var", "command"), [("GPUSLATE_STATE_DIR", ("ps",)),
                                              ("GPUSLATE_STATE_DIR", ("audit",)),
                                              ("GPUSLATE_LOCK_DIR", ("clear", "--yes", "--timeout", "1"))])
def test_a_relative_folder_is_refused_and_nothing_is_made(sim_host, cli, tmp_path, monkeypatch, var, command):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    r = cli(*command, env={var: "state"})
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.splitlines()
    assert lines[0] == f"gpuslate: error: {var} must be an absolute path, not 'state': a relative one would name " \
                       "another folder from every folder gpuslate runs in", r.stderr
    assert lines[1] == f'gpuslate: hint: export {var}="$PWD/state"' and "Traceback" not in r.stderr
    assert os.listdir(work) == []


def test_a_home_relative_folder_is_the_users(sim_host, cli, tmp_path):
    r = cli("ps", "--json", env={"HOME": str(tmp_path / "home"), "GPUSLATE_STATE_DIR": "~/gs"})
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "home" / "gs" / "units").is_dir()
