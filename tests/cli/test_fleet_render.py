"""The fleet's output around each host's result: a document that cannot be read back is that host's
error line (never a traceback), the others are shown; a document without a renderer shows its fields."""

from __future__ import annotations

from gpuslate.cli.fleet import print_fleet
from gpuslate.remote.fleet import FleetResult, HostOutcome
from gpuslate.remote.hosts import HostSpec


def test_a_malformed_document_is_that_hosts_error(capsys):
    good = {"schema": "gpuslate.wait.v1", "ok": True, "gpus": [0, 1], "max_used": 0, "elapsed_s": 0.25,
            "memory": [], "diagnosis": []}
    result = FleetResult(["wait", "--free"], [
        HostOutcome(HostSpec("a"), {"schema": "gpuslate.wait.v1", "ok": True}, None, 0.1),  # fields missing
        HostOutcome(HostSpec("b"), good, None, 0.1),
        HostOutcome(HostSpec("c"), {"schema": "gpuslate.future.v1", "answer": 42, "items": [1, 2]}, None, 0.1)])
    print_fleet(result, "wait")
    out = capsys.readouterr().out
    a, b, c = out.split("── a ──\n")[1].split("── b ──\n")[0], out.split("── b ──\n")[1].split("── c ──")[0], \
        out.split("── c ──\n")[1]
    assert a.startswith("error (bad_document): a: malformed gpuslate.wait.v1 document") and "Traceback" not in out
    assert b == "GPUs 0-1 free after 0.250 s\n"
    assert c.startswith("  schema: gpuslate.future.v1\n  answer: 42\n  items: 2 items\n")
    assert "wait on 3 hosts: 3 ok, 0 failed" in out
