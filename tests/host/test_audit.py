"""The audit log: durable before a signal, whole lines under concurrent writers, fast reads."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpuslate.errors import PermissionDenied, UsageError
from gpuslate.host import audit
from gpuslate.host.audit import AuditLog, new_run_id
from gpuslate.host.statedir import state_dir

SRC = str(Path(__file__).resolve().parents[2] / "src")
ISO_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def _target(pid: int = 4242, **kw: object) -> dict[str, object]:
    t: dict[str, object] = {"pid": pid, "start_ticks": 123456, "user": "alice",
                            "command": "python -m vllm.entrypoints.openai.api_server", "gpus": [0, 1],
                            "used_memory": 40 << 30, "container": None}
    t.update(kw)
    return t


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("GPUSLATE_STATE_DIR", str(d))
    return d


# -- state_dir -------------------------------------------------------------------


def test_state_dir_precedence_and_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GPUSLATE_STATE_DIR", raising=False)
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    assert state_dir() == tmp_path / "home" / ".local" / "state" / "gpuslate"

    monkeypatch.setenv("XDG_STATE_HOME", "relative/is/ignored")
    assert state_dir() == tmp_path / "home" / ".local" / "state" / "gpuslate"

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert state_dir() == tmp_path / "xdg" / "gpuslate"

    monkeypatch.setenv("GPUSLATE_STATE_DIR", str(tmp_path / "explicit"))
    old = os.umask(0o777)  # even a hostile umask gets a usable private folder
    try:
        d = state_dir()
    finally:
        os.umask(old)
    assert d == tmp_path / "explicit"
    assert stat.S_IMODE(d.stat().st_mode) == 0o700


def test_state_dir_that_cannot_be_created(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("GPUSLATE_STATE_DIR", str(tmp_path / "file" / "state"))
    with pytest.raises(PermissionDenied, match=r"^cannot create state directory .*/file/state: "):
        state_dir()
    monkeypatch.setenv("GPUSLATE_STATE_DIR", str(tmp_path / "file"))
    with pytest.raises(PermissionDenied, match="not a directory"):
        state_dir()


# -- writing ---------------------------------------------------------------------


def test_entry_fields(state: Path) -> None:
    log = AuditLog()
    assert log.path == state / "audit.jsonl"
    run_id = new_run_id()
    eid = log.before_signal(run_id=run_id, action="clear", signal="SIGTERM", target=_target(),
                            reason="clear --gpus 0-1")
    lines = log.path.read_text().splitlines()
    assert len(lines) == 1
    e = json.loads(lines[0])
    assert e["event"] == "signal" and e["id"] == eid and e["run_id"] == run_id
    assert e["action"] == "clear" and e["signal"] == "SIGTERM" and e["reason"] == "clear --gpus 0-1"
    assert ISO_RE.match(e["time"])
    assert e["host"] == socket.gethostname()
    assert e["actor"]["uid"] == os.getuid() and e["actor"]["pid"] == os.getpid()
    assert e["actor"]["user"] and e["actor"]["command"] == sys.argv
    assert e["target"] == _target()
    # private: it names other users' processes
    assert stat.S_IMODE(log.path.stat().st_mode) == 0o600

    log.outcome(eid, "delivered", "exited after 0.4 s")
    out = json.loads(log.path.read_text().splitlines()[1])
    assert out["event"] == "outcome" and out["id"] == eid and out["outcome"] == "delivered"
    assert out["detail"] == "exited after 0.4 s" and ISO_RE.match(out["time"])


def test_outcome_must_be_known(state: Path) -> None:
    with pytest.raises(UsageError, match="invalid audit outcome 'killed'"):
        AuditLog().outcome("x", "killed")


def test_run_ids_are_unique_and_sort_by_time() -> None:
    ids = [new_run_id() for _ in range(200)]
    assert len(set(ids)) == len(ids)
    assert all(re.match(r"^\d{8}T\d{6}Z-[0-9a-f]{8}$", i) for i in ids)


def test_unwritable_log_raises_before_any_signal(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    log = AuditLog(tmp_path / "file" / "audit.jsonl")
    with pytest.raises(PermissionDenied, match=r"^cannot open the audit log .*audit\.jsonl: ") as ei:
        log.before_signal(run_id="r", action="clear", signal="SIGTERM", target=_target())
    assert ei.value.hint and "no signal was sent" in ei.value.hint


def test_entry_is_synced_before_before_signal_returns(state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = AuditLog()
    seen: list[str] = []
    real_fsync = os.fsync

    def checking_fsync(fd: int) -> None:
        # At fsync time the complete line must already be in the file, as
        # another process sees it.
        name = os.readlink(f"/proc/self/fd/{fd}")
        if name == str(log.path):
            seen.append(subprocess.run(["cat", name], capture_output=True, text=True, check=True).stdout)
        real_fsync(fd)

    monkeypatch.setattr(audit.os, "fsync", checking_fsync)
    eid = log.before_signal(run_id="r", action="clear", signal="SIGKILL", target=_target())
    assert len(seen) == 1, "before_signal must fsync the log file exactly once"
    assert seen[0].endswith("\n") and json.loads(seen[0].splitlines()[-1])["id"] == eid


def test_one_phase_is_one_fsync_and_every_line_precedes_every_signal(state: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """terminate writes a phase's lines (a job of several processes) with one fsync, and
    every line is on disk before the first of those signals is sent."""
    from gpuslate.proc import terminate as term
    from gpuslate.proc.procfs import read_stat

    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(3)]
    try:
        log = AuditLog()
        events: list[str] = []
        real_fsync, real_send = os.fsync, term.send_signal

        def fsync(fd: int) -> None:
            if os.readlink(f"/proc/self/fd/{fd}") == str(log.path):
                lines = log.path.read_text().splitlines()
                events.append(f"fsync {sum(json.loads(x)['event'] == 'signal' for x in lines)}")
            real_fsync(fd)

        def send(ident, sig):  # type: ignore[no-untyped-def]
            events.append("signal")
            return real_send(ident, sig)

        monkeypatch.setattr(audit.os, "fsync", fsync)
        monkeypatch.setattr(term, "send_signal", send)
        victims = [term.Victim(read_stat(p.pid).ident, {"pid": p.pid}) for p in procs]
        results = term.terminate(victims, grace=5, kill_wait=5, action="clear", run_id=new_run_id(), audit=log)
        assert all(r.ended_by == "SIGTERM" for r in results)
        assert events == ["fsync 3", "signal", "signal", "signal"]
        outcomes = [e for e in map(json.loads, log.path.read_text().splitlines()) if e["event"] == "outcome"]
        assert sorted(o["outcome"] for o in outcomes) == ["delivered"] * 3
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_killed_right_after_before_signal_reads_as_interrupted(state: Path) -> None:
    # The caller's pattern: record, then signal. A run killed at that point
    # leaves its entry, without outcome.
    code = textwrap.dedent("""
        import os, signal
        from gpuslate.host.audit import AuditLog
        log = AuditLog()
        eid = log.before_signal(run_id="r1", action="clear", signal="SIGTERM", target={"pid": 1})
        log.outcome(eid, "delivered")
        log.before_signal(run_id="r1", action="clear", signal="SIGKILL", target={"pid": 2})
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    entries = AuditLog().read()
    assert [(e["target"]["pid"], e["signal"], e["outcome"]) for e in entries] == [
        (1, "SIGTERM", "delivered"), (2, "SIGKILL", None)]
    assert entries[1]["actor"]["pid"] != os.getpid()  # recorded by the child


def test_concurrent_writers_produce_only_whole_lines(state: Path) -> None:
    writers, per_writer = 8, 60
    # long lines (well past a pipe buffer and a page) make any interleaving visible
    code = textwrap.dedent(f"""
        import sys
        from gpuslate.host.audit import AuditLog
        log = AuditLog()
        w = int(sys.argv[1])
        sys.stdin.readline()  # start together
        for i in range({per_writer}):
            eid = log.before_signal(run_id=f"w{{w}}", action="clear", signal="SIGTERM",
                                    target={{"pid": i, "command": str(w) * (5000 + 97 * i)}})
            log.outcome(eid, "delivered", "x" * (i * 31))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code, str(w)], env=_env(), stdin=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for w in range(writers)]
    for p in procs:  # all start together, once every interpreter is up
        p.stdin.write("go\n")  # type: ignore[union-attr]
        p.stdin.flush()  # type: ignore[union-attr]
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err

    raw = (state / "audit.jsonl").read_bytes()
    assert raw.endswith(b"\n")
    lines = raw.split(b"\n")[:-1]
    assert len(lines) == 2 * writers * per_writer
    docs = [json.loads(line) for line in lines]  # every line is whole
    for d in docs:
        if d["event"] == "signal":
            w = d["run_id"][1:]
            assert d["target"]["command"] == w * (5000 + 97 * d["target"]["pid"])
    entries = AuditLog().read()
    assert len(entries) == writers * per_writer
    assert len({e["id"] for e in entries}) == len(entries)
    assert all(e["outcome"] == "delivered" for e in entries)
    # each writer's own entries stay in its order
    for w in range(writers):
        assert [e["target"]["pid"] for e in entries if e["run_id"] == f"w{w}"] == list(range(per_writer))


# -- reading ---------------------------------------------------------------------


def test_read_merges_outcomes_and_limits(state: Path) -> None:
    log = AuditLog()
    assert log.read() == []  # no file yet
    ids = [log.before_signal(run_id="r", action="clear", signal="SIGTERM", target=_target(pid=i))
           for i in range(5)]
    log.outcome(ids[0], "delivered")
    log.outcome(ids[2], "not_running", "exited before the signal")
    log.outcome(ids[3], "error", "first")
    log.outcome(ids[3], "pid_reused", "last one wins")
    all_ = log.read()
    assert [e["target"]["pid"] for e in all_] == [0, 1, 2, 3, 4]
    assert [e["outcome"] for e in all_] == ["delivered", None, "not_running", "pid_reused", None]
    assert all_[3]["outcome_detail"] == "last one wins" and ISO_RE.match(all_[3]["outcome_time"])
    assert all_[1]["outcome_time"] is None and all_[1]["outcome_detail"] is None

    assert log.read(limit=2) == all_[-2:]
    assert log.read(limit=100) == all_
    assert log.read(limit=0) == []


def test_read_since(state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = AuditLog()
    now = [1_700_000_000.0]
    monkeypatch.setattr(audit.time, "time", lambda: now[0])
    for i in range(6):
        now[0] = 1_700_000_000.0 + 10 * i
        log.outcome(log.before_signal(run_id="r", action="clear", signal="SIGTERM", target=_target(pid=i)),
                    "delivered")
    assert [e["target"]["pid"] for e in log.read(since=1_700_000_030.0)] == [3, 4, 5]
    assert [e["target"]["pid"] for e in log.read(since=1_700_000_025.0, limit=2)] == [4, 5]
    assert log.read(since=1_800_000_000.0) == []
    assert len(log.read(since=0)) == 6


def test_torn_and_garbage_lines_are_skipped(state: Path) -> None:
    log = AuditLog()
    first = log.before_signal(run_id="r", action="clear", signal="SIGTERM", target=_target(pid=1))
    with open(log.path, "ab") as f:
        f.write(b"not json at all\n\xff\xfe binary\n[1, 2]\n")
        f.write(b'{"event": "signal", "id": "torn", "run_id": "r", "tar')  # a writer died mid-line
    assert [e["id"] for e in log.read()] == [first]
    assert [e["id"] for e in log.read(limit=5)] == [first]
    # the next entry starts on a fresh line instead of being glued to the torn one
    second = log.before_signal(run_id="r", action="clear", signal="SIGKILL", target=_target(pid=2))
    log.outcome(second, "delivered")
    assert [(e["id"], e["outcome"]) for e in log.read()] == [(first, None), (second, "delivered")]
    assert [e["id"] for e in log.read(limit=1)] == [second]


@pytest.mark.parametrize("block", [7, 64, 1000])
def test_backward_reading_matches_forward_reading(state: Path, monkeypatch: pytest.MonkeyPatch,
                                                  block: int) -> None:
    log = AuditLog()
    for i in range(40):
        eid = log.before_signal(run_id="r", action="clear", signal="SIGTERM",
                                target=_target(pid=i, command="c" * (i * 13)))
        if i % 3:
            log.outcome(eid, "delivered")
    monkeypatch.setattr(audit, "_BLOCK", block)
    forward = log.read()
    for n in (1, 2, 17, 40, 41):
        assert log.read(limit=n) == forward[-n:]


def test_reading_the_newest_of_100k_lines_is_fast(state: Path) -> None:
    log = AuditLog()
    eid = log.before_signal(run_id="r", action="clear", signal="SIGTERM", target=_target())
    log.outcome(eid, "delivered")
    sig_line, out_line = log.path.read_bytes().splitlines()
    with open(log.path, "ab") as f:
        chunk = []
        for i in range(50_000):
            k = b"%016x" % i
            chunk.append(sig_line.replace(eid.encode(), k))
            chunk.append(out_line.replace(eid.encode(), k))
        f.write(b"\n".join(chunk) + b"\n")
    start = time.perf_counter()
    newest = log.read(limit=50)
    elapsed = time.perf_counter() - start
    assert len(newest) == 50 and newest[-1]["id"] == f"{49_999:016x}" and newest[-1]["outcome"] == "delivered"
    assert elapsed < 0.5, f"reading 50 of 100k lines took {elapsed:.2f} s"
