"""Bad input that used to give a traceback or a hang (issue 8): each gives the
documented exit code (2, or 3 for a broken simulated host), one clear line on
stderr, and starts or signals nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from helpers import gpuslate_env, is_gone

HUGE = "9" * 400


def one_line_error(r: subprocess.CompletedProcess[str]) -> str:
    lines = r.stderr.strip().splitlines()
    assert "Traceback" not in r.stderr, r.stderr
    assert len(lines) <= 2 and lines[0].startswith("gpuslate: error: "), lines  # a hint may follow
    assert len(lines) == 1 or lines[1].startswith("gpuslate: hint: "), lines
    return lines[0]


@pytest.mark.parametrize("args,needle", [
    (["status", "--gpus", "0-99999999999"], "GPU indexes are 0 to 1023"),
    (["clear", "--gpus", "0-99999999999", "--dry-run"], "GPU indexes are 0 to 1023"),
    (["status", "--gpus", "\uff10"], "invalid GPU list"),  # a full-width 0
    (["status", "--gpus", "\u0661-\u0663"], "invalid GPU list"),  # Arabic-Indic digits
    (["clear", "--pid", "\uff11\uff12", "--dry-run"], "expected a whole number"),
    (["clear", "--max-used", HUGE, "--dry-run"], "give its unit, e.g. 40GiB"),
    (["clear", "--max-used", HUGE + "GiB", "--dry-run"], "at most 1 EiB"),
    (["clear", "--max-used", "1" + "0" * 20 + "B", "--dry-run"], "at most 1 EiB"),
    (["clear", "--max-used", "40", "--dry-run"], "invalid size '40': give its unit, e.g. 40GiB or 40MiB"),
    (["sim", "hold", "--memory", "40"], "invalid size '40': give its unit"),
    (["clear", "--timeout", "5x", "--dry-run"], "invalid duration '5x': expected seconds (90), or with units"),
    (["sim", "hold", "--memory", HUGE + "G"], "at most 1 EiB"),
    (["status", "--watch", "1e300"], "at most 10000000 seconds"),
    (["clear", "--timeout", "1e300", "--dry-run"], "at most 10000000 seconds"),
    (["clear", "--grace", "nan", "--dry-run"], "invalid duration 'nan'"),
    (["sim", "leak", "--gpu", "\uff13", "--memory", "1GiB"], "expected a whole number"),
])
def test_bad_values_exit_2_at_once(sim_host, hold, cli, args, needle):
    canary = hold("--gpus", "0", "--memory", "1GiB")
    t0 = time.monotonic()
    r = cli(*args, timeout=20)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert needle in one_line_error(r)
    assert time.monotonic() - t0 < 10  # no hang building a range of 10^11 GPUs
    assert not is_gone(canary.pid)


@pytest.mark.parametrize("args,needle", [
    (["--cwd", "/etc/passwd"], "invalid working directory '/etc/passwd': it is not a folder"),
    (["--cwd", "/no/such/dir"], "it does not exist"),
    (["--ready-host", "999.1.1.1"], "invalid address '999.1.1.1'"),
    (["--ready-host", "bad host"], "invalid address"),
    (["--ready", "http://[::1"], "invalid URL 'http://[::1'"),
    (["--ready", "http://127.0.0.1:99999/x"], "invalid URL"),
    (["--ready", "ftp://127.0.0.1/x"], "invalid URL"),
    (["--port", "\uff18\uff10"], "expected a whole number"),
])
def test_bad_unit_options_start_nothing(sim_host, cli, tmp_path, args, needle):
    marker = tmp_path / "started"
    r = cli("up", "web", "--port", "18080", *args, "--", "touch", str(marker), timeout=30)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert needle in one_line_error(r)
    assert not marker.exists()  # the server was never launched
    assert cli("ps", "--json").stdout.count('"name"') == 0


@pytest.mark.parametrize("body,line,needle", [
    ('command = "sleep \\"5"', 3, "cannot split the command line: No closing quotation"),
    ('command = "sleep 5"\nenv = {A = [1, 2]}', 4, "env value of 'A' must be a string or a number, not a list"),
    ('command = "sleep 5"\ngrace = -5', 4, "invalid grace -5"),
    ('command = "sleep 5"\nport = 70000', 4, "must be 1 to 65535"),
    ('command = "sleep 5"\nstart_timeout = 1e300', 4, "at most 10000000 seconds"),
    ('command = "sleep 5"\nready_host = "999.1.1.1"', 4, "invalid address"),
    ('command = "sleep 5"\nready_url = "http://[::1"', 4, "invalid URL"),
    ('command = "sleep 5"\ngpus = "\uff10"', 4, "invalid GPU list"),
    ('command = "sleep 5"\nengine = "tgi"', 4, "must be one of vllm, sglang, trtllm, sim"),
    ('command = "sleep 5"\ncwd = "/etc/passwd"', 4, "it is not a folder"),
])
def test_bad_unit_file_names_file_and_line(sim_host, cli, tmp_path, body, line, needle):
    cfg = tmp_path / "gpuslate.toml"
    cfg.write_text(f"# units\n[units.web]\n{body}\n")
    r = cli("up", "web", "--config", str(cfg), timeout=30)
    assert r.returncode == 2, (r.stdout, r.stderr)
    first = one_line_error(r)
    assert f"{cfg}:{line}: " in first and needle in first, first


@pytest.mark.slow
def test_sim_naming_a_file_or_a_broken_host_exits_3(cli, tmp_path, monkeypatch):
    monkeypatch.delenv("GPUSLATE_SIM", raising=False)
    monkeypatch.setenv("GPUSLATE_STATE_DIR", str(tmp_path / "state"))
    a_file = tmp_path / "file"
    a_file.write_text("x")
    broken = []
    for i, text in enumerate(['{"schema": "gpuslate.simhost.v1", "gpus": "eight"}',
                              '{"schema": "gpuslate.simhost.v1"}', "[1, 2]", "\xff\xfe", "{"]):
        d = tmp_path / f"broken{i}"
        d.mkdir()
        (d / "host.json").write_bytes(text.encode("latin-1"))
        broken.append(d)
    too_long = tmp_path / ("a" * 300)  # a name the kernel refuses (ENAMETOOLONG), found by the fuzz test
    for root in (a_file, *broken, too_long):
        for args in (["status"], ["clear", "--dry-run"], ["wait", "--free", "--timeout", "0"], ["ps"],
                     ["audit"], ["sim", "leak", "--gpu", "0", "--memory", "1GiB"], ["down", "web"]):
            r = subprocess.run([sys.executable, "-m", "gpuslate", "--sim", str(root), *args],
                               capture_output=True, text=True, env=gpuslate_env(), timeout=30)
            assert r.returncode == 3, (root, args, r.stderr)
            first = one_line_error(r)
            assert str(root) in first and ("simulated host" in first or "host.json" in first), first


def test_a_relative_gpuslate_sim_exits_2_and_signals_nothing(sim_host, hold):
    """GPUSLATE_SIM=sim names another folder from every folder a command runs in (as a relative
    state folder would): refused for every command, the holder of the simulated host untouched."""
    canary = hold("--gpus", "0", "--memory", "1GiB")
    here = sim_host.root.parent
    for args in (["status"], ["clear", "--yes"], ["wait", "--free", "--timeout", "0"], ["ps"], ["audit"],
                 ["sim", "leak", "--gpu", "0", "--memory", "1GiB"], ["down", "web"], ["up", "web", "--", "true"]):
        r = subprocess.run([sys.executable, "-m", "gpuslate", *args], capture_output=True, text=True, cwd=here,
                           env=gpuslate_env({"GPUSLATE_SIM": sim_host.root.name}), timeout=30)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert "GPUSLATE_SIM must be an absolute path" in one_line_error(r), args
        assert f'export GPUSLATE_SIM="$PWD/{sim_host.root.name}"' in r.stderr
    assert not is_gone(canary.pid)
    # absolute (or ~): the same host
    r = subprocess.run([sys.executable, "-m", "gpuslate", "status", "--json"], capture_output=True, text=True,
                       env=gpuslate_env({"GPUSLATE_SIM": str(sim_host.root)}), timeout=30)
    assert r.returncode == 0 and any(p["pid"] == canary.pid for p in json.loads(r.stdout)["gpus"][0]["processes"]), \
        r.stderr


def test_interrupt_is_reported_as_interrupted(sim_host, monkeypatch, capsys):
    from gpuslate.api import Host
    from gpuslate.cli.main import main

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(Host, "status", interrupted)
    assert main(["--json", "status"]) == 130
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["error"]["type"] == "interrupted" and doc["error"]["exit_code"] == 130
    assert err == "gpuslate: error: interrupted\n"


@pytest.mark.parametrize("args,hint", [
    (["stauts"], "did you mean 'status'? "), (["clear", "--dryrun"], "did you mean --dry-run? "),
    (["sim", "iniit", "x"], "did you mean 'init'? "), (["status", "--jsno"], "did you mean --json? "),
    (["experiment", "rnu", "x"], "did you mean 'run'? "), (["clear", "--bogus"], None), (["zzz"], None),
])
def test_did_you_mean(sim_host, cli, args, hint):
    r = cli(*args)
    assert r.returncode == 2 and r.stdout == ""
    (line,) = r.stderr.splitlines()  # still one line
    assert line.startswith("gpuslate: error: ") and ("did you mean" in line) == (hint is not None), line
    if hint:
        assert hint in line


def test_gpus_all_is_every_gpu_wherever_gpus_is(sim_host, cli, tmp_path):
    """docker's spelling: --gpus all, for every option that selects GPUs (and gpus = "all" in a unit file)."""
    from gpuslate.units.spec import resolve

    assert [g["index"] for g in json.loads(cli("status", "--gpus", "all", "--json").stdout)["gpus"]] == list(range(8))
    assert json.loads(cli("clear", "--gpus", "all", "--dry-run", "--json").stdout)["gpus"] == list(range(8))
    assert json.loads(cli("wait", "--free", "--gpus", "all", "--timeout", "0", "--json").stdout)["gpus"] == \
        list(range(8))
    r = cli("sim", "hold", "--gpus", "al", "--memory", "0")
    assert r.returncode == 2 and "expected indexes and ranges like 0,2-3, or all" in r.stderr
    toml = tmp_path / "gpuslate.toml"
    toml.write_text('[units.a]\ncommand = "sleep 1"\ngpus = "0-1"\nport = 1\n'
                    '[units.b]\ncommand = "sleep 1"\ngpus = "all"\nport = 1\n')
    assert resolve("a", config=toml).gpus == [0, 1]
    assert resolve("a", config=toml, overrides={"gpus": "all"}).gpus is None  # the file's GPUs overridden
    assert resolve("b", config=toml).gpus is None
