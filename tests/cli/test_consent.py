"""Silence is no consent: a command that ends processes it does not name, without a terminal on stdin
and without ``--yes``, starts nothing, signals nothing and exits 2 with the line that says to add
``--yes`` (cli/main.py, read from each verb's declaration: gpuslate/verbs.py). Real holders, real
pipes and /dev/null; each test proves with the holder's own /proc entry and the audit log that
nothing was signaled."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import gpuslate_env, is_gone, run_cli


def refused(r: subprocess.CompletedProcess[str], what: str) -> None:
    """Exit 2, one line naming the command and saying to add --yes; no traceback."""
    assert r.returncode == 2, (r.stdout, r.stderr)
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"gpuslate: error: '{what}' ends processes it does not name") and "add --yes" in line, line
    assert "nothing was started or signaled" in line


def audit_entries() -> list[dict]:
    r = run_cli("audit", "--json", "--limit", "0")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["entries"]


@pytest.mark.parametrize("stdin", ["pipe n", "pipe y", "/dev/null", "closed"])
def test_clear_without_a_terminal_and_without_yes_signals_nothing(sim_host, hold, stdin):
    """``echo n | gpuslate clear``, ``echo y | ...`` (a pipe is nobody's answer), ``</dev/null`` and a
    closed stdin: exit 2, the holder and its workers alive, nothing audited."""
    victim = hold("--gpus", "6", "--memory", "2GiB", "--workers", "2")
    argv = [sys.executable, "-m", "gpuslate", "clear", "--gpus", "6", "--grace", "1"]
    if stdin == "closed":
        r = subprocess.run(["sh", "-c", 'exec "$@" <&-', "sh", *argv], capture_output=True, text=True,
                           env=gpuslate_env(), timeout=60)
    elif stdin == "/dev/null":
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=gpuslate_env(),
                           timeout=60)
    else:
        r = subprocess.run(argv, input=stdin[-1] + "\n", capture_output=True, text=True, env=gpuslate_env(),
                           timeout=60)
    refused(r, "clear")
    assert "--dry-run shows the plan" in r.stderr
    assert not any(is_gone(p) for p in victim.pids), "a holder was signaled"
    assert audit_entries() == []


def test_clear_with_json_says_it_in_the_error_document(sim_host, hold):
    victim = hold("--gpus", "6", "--memory", "2GiB")
    r = run_cli("clear", "--gpus", "6", "--json")
    assert r.returncode == 2 and json.loads(r.stdout)["error"]["type"] == "usage"
    assert not is_gone(victim.pid)


def test_a_dry_run_needs_no_consent_and_yes_is_consent(sim_host, hold):
    victim = hold("--gpus", "6", "--memory", "2GiB")
    r = run_cli("clear", "--gpus", "6", "--dry-run", "--json")
    assert r.returncode == 0 and [t["pid"] for t in json.loads(r.stdout)["targets"]] == [victim.pid], r.stderr
    assert not is_gone(victim.pid) and audit_entries() == []
    r = run_cli("clear", "--gpus", "6", "-y", "--grace", "1", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["status"] == "clean", r.stderr
    assert is_gone(victim.pid) and audit_entries()


def test_up_clear_without_a_terminal_starts_nothing(sim_host, hold, tmp_path):
    """``up --clear`` ends what holds the unit's GPUs (clear's plan): the same rule; no unit started,
    no record written, the holder alive. Without --clear, up needs no consent (it names its unit)."""
    victim = hold("--gpus", "2", "--memory", "2GiB")
    r = run_cli("up", "web", "--gpus", "2", "--clear", "--", "sleep", "60")
    refused(r, "up --clear")
    assert not is_gone(victim.pid) and audit_entries() == []
    assert not (tmp_path / "state" / "units").exists() or not list((tmp_path / "state" / "units").glob("web*"))


def test_the_units_verbs_need_none(sim_host, tmp_path):
    """``down``/``swap``/``restart`` signal only the units they name (as docker compose down, asked
    nothing): a script without a terminal stops its unit without --yes."""
    r = run_cli("up", "web", "--gpus", "3", "--ready-log", "ready", "--", "sh", "-c", "echo ready; exec sleep 60")
    assert r.returncode == 0, r.stderr
    pid = json.loads(run_cli("ps", "--json").stdout)["units"][0]["pid"]
    r = run_cli("down", "web")
    assert r.returncode == 0, r.stderr
    assert is_gone(pid)
    # "1 process", not "1 processes"
    assert "Unit web stopped (ready before): 1 process (SIGTERM 1, SIGKILL 0)" in r.stdout + r.stderr


def test_over_host_the_consent_is_asked_here_before_any_host(sim_host, hold):
    """The fleet path: refused locally (exit 2), before a host is contacted (no ssh to a host that does
    not exist: that would be exit 3 or 7)."""
    r = run_cli("-H", "no-such-host.invalid", "clear", "--gpus", "0")
    refused(r, "clear")
    r = run_cli("-H", "no-such-host.invalid", "up", "web", "--clear", "--", "sleep", "1")
    refused(r, "up --clear")


def test_experiment_that_clears_first_needs_consent(sim_host, hold, tmp_path):
    """A spec with ``clear = true`` clears the first deployment's GPUs (as up --clear): without a
    terminal and without --yes, nothing starts."""
    pytest.importorskip("aiohttp")
    victim = hold("--gpus", "0", "--memory", "2GiB")
    spec = tmp_path / "spec.toml"
    spec.write_text('[experiment]\nname = "x"\nclear = true\n\n[load]\nconcurrency = [1]\n\n'
                    '[units.a]\ncommand = "sleep 60"\ngpus = "0"\nport = 39999\n')
    r = run_cli("experiment", "run", str(spec), "--out", str(tmp_path / "out"))
    assert r.returncode == 2, r.stderr
    assert "clear = true" in r.stderr and "add --yes" in r.stderr
    assert not is_gone(victim.pid) and not (tmp_path / "out").exists()
