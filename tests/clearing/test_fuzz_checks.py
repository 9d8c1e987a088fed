"""The fuzzer's invariants (tests/fuzzkit/checks.py) each catch what they name: a check that
cannot fail would let tests/clearing/test_fuzz_forests.py pass on a planner that kills bystanders."""

from __future__ import annotations

import signal
from typing import Any

from fuzzkit.checks import Observed, check_all, tree_state

NS = "pid:[4026531836]"


def proc(label: str, pid: int, ppid: int, pgid: int, *, uid: int = 0, holds: list | None = None,
         title: str | None = None, term: str = "default", kind: str = "node", ns: str = NS,
         nspid: str | None = None) -> tuple[str, dict[str, Any]]:
    return label, {"pid": pid, "ticks": 1000 + pid, "ppid": ppid, "pgid": pgid, "sid": pgid or 1, "uid": uid,
                   "name": title or f"fuzz-{label}", "state": "S", "ns": ns, "nspid": nspid or str(pid),
                   "node": label, "kind": kind, "spec": "", "holds": holds or [], "handles": [],
                   "title": title or f"fuzz-{label}", "term": term, "children": [], "wrapped": None}


def target(pid: int, role: str = "holder", job: int | None = None, **kw: Any) -> dict[str, Any]:
    return {"pid": pid, "start_ticks": 1000 + pid, "role": role, "reason": "holds 1 GiB on GPU 0",
            "job": pid if job is None else job, "permission_denied": False, "refused": None, **kw}


def doc(targets: list[dict], spared: list[dict], status: str = "clean", gpus: list[int] | None = None) -> dict:
    return {"status": status, "verify": "free", "gpus": [0] if gpus is None else gpus, "targets": targets,
            "spared": spared, "diagnosis": []}


def observed(before: dict, after: dict, act: dict, *, audit: list | None = None, sel: dict | None = None,
             dry: dict | None = None) -> Observed:
    selection = {"gpus": None, "pids": [], "user": None, "match": None, "all_users": False,
                 "include_handles": False, "holders_only": False, **(sel or {})}
    return Observed(before=before, after=after, selection=selection, dry={"doc": dry or act}, act={"doc": act},
                    audit=audit if audit is not None else
                    [{"signal": "SIGTERM", "target": {"pid": t["pid"], "start_ticks": t["start_ticks"],
                                                      "role": t["role"]}, "outcome": "delivered"}
                     for t in act["targets"]],
                    forked=[], killed=[], extra_after={}, outside_before={}, outside_after={}, stray_audit=[],
                    caller=2, cli=False, user_uids={"root": 0})


def classes(o: Observed) -> set[str]:
    return {v["cls"] for v in check_all(o)}


def test_a_clean_act_breaks_nothing():
    before = dict([proc("a", 10, 2, 10, holds=[[0, 1]]), proc("b", 11, 10, 10)])
    act = doc([target(10, "launcher"), target(11, "job member")], [])
    assert classes(observed(before, {"a": False, "b": False}, act)) == set()


def test_a_spared_child_killed_through_a_forwarder_is_collateral():
    before = dict([proc("a", 10, 2, 10, holds=[[0, 1]], term="forward"), proc("b", 11, 10, 11, uid=7)])
    act = doc([target(10)], [{"pid": 11, "reason": "another user's process"}])
    o = observed(before, {"a": False, "b": False}, act)
    (v,) = [v for v in check_all(o) if v["cls"] == "collateral"]
    assert "forwards SIGTERM" in v["msg"]


def test_a_namespace_member_ended_with_its_init_is_collateral():
    inner = "pid:[4026532999]"
    before = dict([proc("a", 10, 2, 10, holds=[[0, 1]], ns=inner, nspid="10\t1"),
                   proc("b", 11, 10, 10, ns=inner, nspid="11\t2", title="monitor")])
    act = doc([target(10)], [{"pid": 11, "reason": "device handle only"}])
    o = observed(before, {"a": False, "b": False}, act)
    assert any("namespace's init" in v["msg"] for v in check_all(o) if v["cls"] == "collateral")


def test_a_signal_to_an_unplanned_process_breaks_act_equals_plan():
    before = dict([proc("a", 10, 2, 10, holds=[[0, 1]]), proc("b", 11, 2, 11)])
    act = doc([target(10)], [])
    audit = [{"signal": "SIGTERM", "target": {"pid": p, "start_ticks": 1000 + p, "role": "holder"},
              "outcome": "delivered"} for p in (10, 11)]
    assert "signaled-not-planned" in classes(observed(before, {"a": False, "b": False}, act, audit=audit))


def test_clean_over_nothing_and_clean_while_held():
    before = dict([proc("a", 10, 2, 10, holds=[[0, 1]], uid=7)])
    empty = doc([], [{"pid": 10, "reason": "another user's process"}], gpus=[])
    assert "empty-success" in classes(observed(before, {"a": True}, empty))
    held = doc([], [{"pid": 10, "reason": "another user's process"}])
    assert "clean-but-held" in classes(observed(before, {"a": True}, held))


def test_a_renamed_process_spared_as_infrastructure_and_an_unlisted_descendant():
    before = dict([proc("a", 10, 2, 10, holds=[[0, 1]]), proc("b", 11, 10, 10, title="sshd"),
                   proc("c", 12, 10, 10)])
    act = doc([target(10, "launcher")], [{"pid": 11, "reason": "session or container infrastructure (sshd)"}])
    assert {"name-protected", "unlisted"} <= classes(observed(before, {"a": False, "b": True, "c": True}, act))


def test_jobs_merged_through_group_0_are_unrelated_targets():
    before = dict([proc("a", 10, 2, 0, holds=[[0, 1]]), proc("b", 11, 2, 0, holds=[[1, 1]])])
    act = doc([target(10), target(11, "job member")], [])
    o = observed(before, {"a": False, "b": False}, act, sel={"pids": [10]})
    assert "target-unrelated" in classes(o)


def test_the_dry_run_and_the_act_must_plan_alike():
    before = dict([proc("a", 10, 2, 10, holds=[[0, 1]]), proc("b", 11, 10, 10)])
    act = doc([target(10, "launcher"), target(11, "job member")], [])
    dry = doc([target(10, "launcher")], [{"pid": 11, "reason": "x"}], status="dry_run")
    assert "dry-run-differs" in classes(observed(before, {"a": False, "b": False}, act, dry=dry))


def test_a_refused_target_that_still_holds_is_no_clean_success():
    before = dict([proc("a", 10, 2, 10, holds=[[0, 1]], term="forward"), proc("b", 11, 10, 11, uid=7)])
    act = doc([target(10, refused="signalling it could end 11")], [{"pid": 11, "reason": "another user's process"}])
    act["verify"] = "released"
    o = observed(before, {"a": True, "b": True}, act, audit=[])
    assert "clean-but-held" in classes(o)


def test_what_lies_below_a_protected_process_is_not_considered():
    before = dict([proc("a", 10, 2, 10, holds=[[0, 1]]), proc("su", 11, 10, 10, kind="wrapper"),
                   proc("c", 12, 11, 12, uid=7)])
    act = doc([target(10)], [{"pid": 11, "reason": "session or container infrastructure (su)"}])
    assert "unlisted" not in classes(observed(before, {"a": False, "su": True, "c": True}, act))


def test_a_file_written_outside_the_state_folder_is_seen(tmp_path):
    state, sim = tmp_path / "state", tmp_path / "sim"
    for d in (state, sim, tmp_path / "canary"):
        d.mkdir()
    before_tree = tree_state(tmp_path, skip=(state, sim))
    (state / "audit.jsonl").write_text("{}\n")  # inside: allowed
    assert tree_state(tmp_path, skip=(state, sim)) == before_tree
    (tmp_path / "canary" / "audit.jsonl").write_text("{}\n")
    before = dict([proc("a", 10, 2, 10, holds=[[0, 1]])])
    o = observed(before, {"a": False}, doc([target(10)], []))
    o.outside_before, o.outside_after = before_tree, tree_state(tmp_path, skip=(state, sim))
    assert "wrote-outside" in classes(o)


def test_a_collateral_death_says_how_the_process_ended():
    """The wait status of whoever reaped it: a SIGHUP is the kernel's (issue 24: the unexplained find
    was an orphaned group with a stopped member, SIGHUPed by the kernel, not signaled by gpuslate)."""
    before = dict([proc("a", 10, 2, 10, holds=[[0, 1]]), proc("b", 11, 1, 11, holds=[[0, 1]], uid=7)])
    act = doc([target(10)], [{"pid": 11, "reason": "another user's process"}])
    o = observed(before, {"a": False, "b": False}, act)
    o.reaped = {11: signal.SIGHUP}  # a wait status: killed by signal 1
    (v,) = [v for v in check_all(o) if v["cls"] == "collateral"]
    assert "killed by SIGHUP: the kernel's" in v["msg"]
    o.reaped = {11: 3 << 8}
    (v,) = [v for v in check_all(o) if v["cls"] == "collateral"]
    assert "(exited 3)" in v["msg"]
