"""The fleet's output around each host's result: a document that cannot be read back makes that host
failed (``bad_document``, exit 2: its error line, never a traceback, and the summary says so), the others
are shown; a document without a renderer shows its fields."""

from __future__ import annotations

from gpuslate.cli.exits import exit_code_of, fleet_exit_code
from gpuslate.cli.fleet import print_fleet, read_back
from gpuslate.errors import BadDocument, RemoteCommandFailed
from gpuslate.remote.fleet import FleetResult, HostOutcome
from gpuslate.remote.hosts import HostSpec

GOOD = {"schema": "gpuslate.wait.v1", "ok": True, "gpus": [0, 1], "max_used": 0, "elapsed_s": 0.25,
        "memory": [], "diagnosis": []}


def test_a_malformed_document_is_that_hosts_failure(capsys):
    result = read_back(FleetResult(["wait", "--free"], [
        HostOutcome(HostSpec("a"), {"schema": "gpuslate.wait.v1", "ok": True}, None, 0.1),  # fields missing
        HostOutcome(HostSpec("b"), GOOD, None, 0.1),
        HostOutcome(HostSpec("c"), {"schema": "gpuslate.future.v1", "answer": 42, "items": [1, 2]}, None, 0.1)]))
    a, b, c = result.hosts
    assert isinstance(a.error, BadDocument) and not a.ok and exit_code_of(a) == 2
    assert b.ok and c.ok and exit_code_of(b) == 0
    assert fleet_exit_code([exit_code_of(h) for h in result.hosts]) == 7  # some failed
    print_fleet(result, "wait")
    out = capsys.readouterr().out
    sa, sb, sc = out.split("── a ──\n")[1].split("── b ──\n")[0], out.split("── b ──\n")[1].split("── c ──")[0], \
        out.split("── c ──\n")[1]
    assert sa.startswith("error (bad_document): a: malformed gpuslate.wait.v1 document") and "Traceback" not in out
    assert sb == "GPUs 0-1 free after 0.250 s\n"
    assert sc.startswith("  schema: gpuslate.future.v1\n  answer: 42\n  items: 2 items\n")
    assert "wait on 3 hosts: 2 ok, 1 failed" in out
    summary = out.split("failed\n", 1)[1]
    assert any(line.split()[:3] == ["a", "bad_document", "2"] for line in summary.splitlines()), summary


def test_a_bad_document_replaces_the_remote_exit_code(capsys):
    """A host whose command failed (exit 4) and sent a document that cannot be read: exit 2, bad_document."""
    failed = RemoteCommandFailed("a: not free", exit_code=4)
    result = read_back(FleetResult(["wait"], [
        HostOutcome(HostSpec("a"), {"schema": "gpuslate.wait.v1", "gpus": "x"}, failed, 0.1)]))
    (a,) = result.hosts
    assert isinstance(a.error, BadDocument) and exit_code_of(a) == 2
    assert fleet_exit_code([exit_code_of(a)]) == 2
    print_fleet(result, "wait")
    out = capsys.readouterr().out
    assert "error (bad_document): a: malformed gpuslate.wait.v1 document" in out
    assert "wait on 1 host: 0 ok, 1 failed" in out and "Traceback" not in out
    # a readable document keeps the remote's own failure
    kept = read_back(FleetResult(["wait"], [HostOutcome(HostSpec("a"), {**GOOD, "ok": False}, failed, 0.1)]))
    assert kept.hosts[0].error is failed and exit_code_of(kept.hosts[0]) == 4
