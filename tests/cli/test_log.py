"""``gpuslate log``: the audit log as a table and as a JSON document."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpuslate.cli.commands import audit as log_cmd
from gpuslate.cli.main import build_parser
from gpuslate.host.audit import AuditLog
from gpuslate.host.auditlist import AuditListing

SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.fixture
def audit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AuditLog:
    monkeypatch.setenv("GPUSLATE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("COLUMNS", "250")  # one table row per entry
    return AuditLog()


def _parse(*argv: str) -> argparse.Namespace:
    # as cli/main.py parses: the parser made from the command table, this command's options built
    return build_parser(argv).parse_args(argv)


def _fill(log: AuditLog) -> list[str]:
    a = log.before_signal(run_id="r1", action="clear", signal="SIGTERM", reason="clear --gpus 0-3",
                          target={"pid": 4101, "start_ticks": 9, "user": "alice", "gpus": [0, 1, 2, 3],
                                  "command": "python -m vllm serve [model]", "used_memory": 1 << 30,
                                  "container": None})
    log.outcome(a, "delivered", "exited after 0.2 s")
    b = log.before_signal(run_id="r1", action="clear", signal="SIGKILL",
                          target={"pid": 4102, "start_ticks": 10, "user": "bob", "gpus": [5],
                                  "command": "sglang.launch_server", "used_memory": None, "container": "abc"})
    return [a, b]


def test_arguments() -> None:
    args = _parse("log")
    assert args.limit == 50 and args.json is False and args.old_name is True
    assert args.handler.args == ("audit",)  # run by the audit command's module
    assert _parse("audit").old_name is False
    args = _parse("log", "--limit", "0", "--json")
    assert args.limit == 0 and args.json is True
    args = _parse("--json", "log")
    assert args.json is True
    with pytest.raises(SystemExit):
        _parse("log", "--limit", "-1")
    with pytest.raises(SystemExit):
        _parse("log", "--limit", "many")


def test_json_document(audit: AuditLog, capsys: pytest.CaptureFixture[str]) -> None:
    ids = _fill(audit)
    assert log_cmd.run(_parse("log", "--json")) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "gpuslate.log.v1"
    assert doc["path"] == str(audit.path)
    assert [e["id"] for e in doc["entries"]] == ids  # newest last
    first, second = doc["entries"]
    assert first["outcome"] == "delivered" and first["outcome_detail"] == "exited after 0.2 s"
    assert second["outcome"] is None
    assert second["target"]["pid"] == 4102 and second["signal"] == "SIGKILL"


def test_limit(audit: AuditLog, capsys: pytest.CaptureFixture[str]) -> None:
    ids = _fill(audit)
    log_cmd.run(_parse("log", "--json", "--limit", "1"))
    assert [e["id"] for e in json.loads(capsys.readouterr().out)["entries"]] == ids[1:]
    log_cmd.run(_parse("log", "--json", "--limit", "0"))
    assert [e["id"] for e in json.loads(capsys.readouterr().out)["entries"]] == ids


def test_table(audit: AuditLog, capsys: pytest.CaptureFixture[str]) -> None:
    _fill(audit)
    assert log_cmd.run(_parse("log")) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == ["Time", "By", "Action", "Signal", "PID", "User", "Command", "GPUs", "Outcome"]
    row1, row2 = lines[1], lines[2]
    for text in ("clear", "SIGTERM", "4101", "alice", "python -m vllm serve [model]", "0-3",
                 "delivered", "exited after 0.2 s"):
        assert text in row1
    for text in ("SIGKILL", "4102", "bob", "sglang.launch_server", " 5 ", "unknown (run interrupted)"):
        assert text in row2
    assert str(audit.path) in lines[-1]


def test_empty_log(audit: AuditLog, capsys: pytest.CaptureFixture[str]) -> None:
    assert log_cmd.run(_parse("log")) == 0
    assert "no signals recorded" in capsys.readouterr().out
    assert log_cmd.run(_parse("log", "--json")) == 0
    assert json.loads(capsys.readouterr().out)["entries"] == []


def test_interrupted_run_shows_as_unknown(audit: AuditLog, capsys: pytest.CaptureFixture[str]) -> None:
    # a real run killed between recording a signal and recording its outcome
    code = textwrap.dedent("""
        import os, signal
        from gpuslate.host.audit import AuditLog, new_run_id
        AuditLog().before_signal(run_id=new_run_id(), action="swap", signal="SIGTERM",
                                 target={"pid": 777, "user": "carol", "command": "llama-server", "gpus": [2]})
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", code], env=env)
    assert proc.returncode == -signal.SIGKILL
    log_cmd.run(_parse("log"))
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "777" in line)
    assert "swap" in row and "carol" in row and "unknown (run interrupted)" in row


def test_without_sim_a_file_of_simulated_hosts_says_whose_it_is(tmp_path, monkeypatch, capsys):
    """A state folder a simulated host shares: `audit` (the driver's entries) shows none, and says
    which simulated hosts' entries the file holds and how to see them."""
    monkeypatch.setenv("GPUSLATE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("GPUSLATE_SIM", raising=False)
    sim = AuditLog(backend="sim", sim_root="/tmp/some-sim")
    e = sim.before_signal(run_id="r1", action="clear", signal="SIGTERM", reason="test",
                          target={"pid": 4242, "user": "alice", "command": "python serve.py", "gpus": [0]})
    sim.outcome(e, "delivered")
    args = _parse("audit")
    assert log_cmd.run(args) == 0
    out = capsys.readouterr().out
    assert "no signals recorded" in out and "for this host (the NVIDIA driver)" in out
    assert "it holds entries of the simulated host /tmp/some-sim: gpuslate audit --sim /tmp/some-sim" in out
    assert log_cmd.run(_parse("audit", "--json")) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["entries"] == [] and doc["other_sims"] == ["/tmp/some-sim"]
    assert AuditListing.from_json(doc).other_sims == ("/tmp/some-sim",)
