"""`clear` across users: another user's job is spared unless --all-users; a
target gpuslate may not signal is reported (exit 5) while the rest proceed.

Needs root (to create a second user and run processes as it); skipped otherwise.
"""

from __future__ import annotations

import json
import time

from helpers import is_gone, wait_for
from otheruser import USER, run_as, start_as


def test_other_users_job_spared_without_all_users(shared_host, other_user, cli):
    p, pid = start_as(other_user, shared_host, "1")
    try:
        t0 = time.monotonic()
        r = cli("clear", "--gpus", "1", "--timeout", "60", "--json", "--yes")
        assert r.returncode == 4, r.stderr
        assert time.monotonic() - t0 < 2.5  # only a job clear may not end holds the GPU: said at once
        doc = json.loads(r.stdout)
        assert doc["status"] == "held_by_others"
        assert doc["targets"] == []
        (s,) = doc["spared"]
        assert s["pid"] == pid and s["user"] == USER and "another user's" in s["reason"]
        (problem,) = doc["diagnosis"][0]["problems"]
        assert problem["pid"] == pid and problem["user"] == USER and "--all-users" in problem["remedy"]
        assert not is_gone(pid)
        r = cli("clear", "--gpus", "1", "--all-users", "--json", "--yes")
        assert r.returncode == 0, r.stdout
        assert [t["pid"] for t in json.loads(r.stdout)["targets"]] == [pid]
        assert is_gone(pid)
    finally:
        p.kill()
        p.wait()


def test_permission_denied_reported_rest_proceed(shared_host, other_user):
    root_p, root_pid = start_as(None, shared_host, "0")
    user_p, user_pid = start_as(other_user, shared_host, "2")
    base = shared_host.root.parent
    try:
        r = run_as(other_user, ["-m", "gpuslate", "clear", "--all-users", "--timeout", "1", "--json", "--yes"],
                   capture_output=True,
                   env={"GPUSLATE_SIM": str(shared_host.root), "GPUSLATE_LOCK_DIR": str(base / "locks"),
                        "GPUSLATE_STATE_DIR": str(base / "state-user")})
        assert r.returncode == 5, (r.stdout, r.stderr)
        doc = json.loads(r.stdout)
        by_pid = {t["pid"]: t for t in doc["targets"]}
        root = by_pid[root_pid]
        assert root["permission_denied"] and root["signals"][0]["outcome"] == "permission_denied"
        assert by_pid[user_pid]["ended_by"] == "SIGTERM"
        wait_for(lambda: is_gone(user_pid))
        assert not is_gone(root_pid)
        gpu0 = next(d for d in doc["diagnosis"] if d["gpu"] == 0)
        assert "not permitted" in gpu0["problems"][0]["reason"]
    finally:
        for p in (root_p, user_p):
            p.kill()
            p.wait()
