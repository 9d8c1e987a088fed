"""State files and folders under attack: symlinks, folders others own or can write.

The attack of issue 8: another user who can write the state folder makes
``audit.jsonl`` a symlink to a file of root's; a root ``clear`` must not append
to that file, and must signal nothing.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from gpuslate.errors import PermissionDenied
from gpuslate.host.audit import AuditLog
from gpuslate.host.statedir import check_private, read_state_file, state_dir, write_state_file
from helpers import is_gone, unit_records

OTHER_UID = 54321  # no user needed: root can chown to any uid


def test_audit_log_symlink_is_refused_and_nothing_is_signaled(sim_host, hold, cli, tmp_path):
    victim = tmp_path / "roots-file"
    victim.write_text("precious\n")
    state = Path(os.environ["GPUSLATE_STATE_DIR"])
    state.mkdir(mode=0o700)
    (state / "audit.jsonl").symlink_to(victim)
    h = hold("--gpus", "0", "--memory", "1GiB")
    r = cli("clear", "--gpus", "0", "--yes", "--timeout", "5")
    assert r.returncode == 5, (r.stdout, r.stderr)
    assert "symbolic link" in r.stderr and "audit.jsonl" in r.stderr
    assert victim.read_text() == "precious\n"
    assert not is_gone(h.pid)  # the entry could not be written, so no signal went out


def test_audit_log_read_refuses_a_symlink(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUSLATE_STATE_DIR", str(tmp_path / "state"))
    log = AuditLog()
    (tmp_path / "elsewhere.jsonl").write_text('{"event": "signal", "id": "x"}\n')
    log.path.symlink_to(tmp_path / "elsewhere.jsonl")
    with pytest.raises(PermissionDenied, match="symbolic link"):
        log.read()


@pytest.mark.parametrize("mode,needle", [(0o777, "writable by group and others"), (0o720, "writable by group"),
                                         (0o702, "writable by others")])
def test_state_folder_writable_by_others_is_refused(sim_host, hold, cli, mode, needle):
    state = Path(os.environ["GPUSLATE_STATE_DIR"])
    state.mkdir()
    state.chmod(mode)
    h = hold("--gpus", "0", "--memory", "1GiB")
    r = cli("clear", "--gpus", "0", "--yes")
    assert r.returncode == 5, (r.stdout, r.stderr)
    first = r.stderr.splitlines()[0]
    assert first.startswith("gpuslate: error: refusing state directory") and needle in first
    assert not is_gone(h.pid)
    r = cli("audit")
    assert r.returncode == 5 and needle in r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a folder to another uid")
def test_state_folder_owned_by_another_user_is_refused(sim_host, hold, cli):
    state = Path(os.environ["GPUSLATE_STATE_DIR"])
    state.mkdir(mode=0o700)
    os.chown(state, OTHER_UID, -1)
    h = hold("--gpus", "0", "--memory", "1GiB")
    r = cli("clear", "--gpus", "0", "--yes")
    assert r.returncode == 5, (r.stdout, r.stderr)
    assert f"owned by uid {OTHER_UID}, not by you" in r.stderr
    assert not is_gone(h.pid)
    assert not (state / "audit.jsonl").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown")
def test_folders_above_are_checked_up_to_the_first_one_the_user_owns(tmp_path):
    # as sshd's safe_path: root-owned folders are climbed, the user's own folder ends the walk
    user = 4242
    home = tmp_path / "home"
    state = home / "shared" / "state"
    state.mkdir(parents=True)
    for d in (home, home / "shared", state):
        d.chmod(0o755)
    os.chown(home, user, -1)  # home is the user's; shared and state are root's
    check_private(state, uid=user)
    (home / "shared").chmod(0o777)  # root's folder that anyone can write: state can be swapped
    with pytest.raises(PermissionDenied, match="shared is writable by group and others"):
        check_private(state, uid=user)
    (home / "shared").chmod(0o755)
    os.chown(home / "shared", OTHER_UID, -1)  # a third user's folder above the state
    with pytest.raises(PermissionDenied, match=f"owned by uid {OTHER_UID}"):
        check_private(state, uid=user)
    home.chmod(0o777)  # above the user's own folder nothing is looked at ... but the user's own must be private
    os.chown(home / "shared", 0, -1)
    with pytest.raises(PermissionDenied, match="home is writable"):
        check_private(state, uid=user)


def test_unit_record_is_never_read_or_written_through_a_symlink(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUSLATE_STATE_DIR", str(tmp_path / "state"))
    target = tmp_path / "not-a-record.json"
    target.write_text("{}")
    path = unit_records().record_path("web")
    path.symlink_to(target)
    with pytest.raises(PermissionDenied, match=r"web\.json: it is a symbolic link, not a regular file"):
        unit_records().read("web")  # refused (ps and down exit 5 saying why), never followed
    with pytest.raises(PermissionDenied, match="symbolic link"):
        read_state_file(path)
    write_state_file(path, b'{"new": 1}')  # replaces the link itself, atomically
    assert not path.is_symlink() and json.loads(path.read_text()) == {"new": 1}
    assert target.read_text() == "{}"


def test_state_file_temp_name_planted_as_symlink_is_not_followed(tmp_path):
    target = tmp_path / "victim"
    target.write_text("keep")
    path = tmp_path / "rec.json"
    (tmp_path / f".rec.json.{os.getpid()}.tmp").symlink_to(target)
    write_state_file(path, b"data")
    assert path.read_bytes() == b"data" and target.read_text() == "keep"


def test_simulated_runs_keep_state_inside_the_simulated_host(sim_host, hold, cli, monkeypatch, tmp_path):
    monkeypatch.delenv("GPUSLATE_STATE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    assert state_dir() == sim_host.root / "state"
    h = hold("--gpus", "1", "--memory", "1GiB")
    r = cli("clear", "--gpus", "1", "--yes", "--json")
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "home").exists()  # the real audit log was not touched
    (entry,) = [json.loads(line) for line in (sim_host.root / "state" / "audit.jsonl").read_text().splitlines()
                if '"signal"' in line and '"event":"signal"' in line]
    assert entry["backend"] == "sim" and entry["sim"] == str(sim_host.root) and entry["host"] == os.uname().nodename
    assert entry["target"]["pid"] == h.pid


def test_audit_sim_is_honoured(tmp_path, monkeypatch, hold, cli, sim_host):
    from gpuslate.gpu.simhost.host import SimHost

    other = SimHost.init(tmp_path / "other", gpus=2, memory=8 << 30)
    monkeypatch.setenv("GPUSLATE_STATE_DIR", str(tmp_path / "shared-state"))  # one log for both hosts
    h1 = hold("--gpus", "0", "--memory", "1GiB")
    h2 = hold("--gpus", "0", "--memory", "1GiB", host=other)
    assert cli("clear", "--yes", "--gpus", "0").returncode == 0
    assert cli("--sim", str(other.root), "clear", "--yes", "--gpus", "0").returncode == 0
    for root, pid in ((sim_host.root, h1.pid), (other.root, h2.pid)):
        r = cli("audit", "--sim", str(root), "--json")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["schema"] == "gpuslate.audit.v1"
        assert {e["target"]["pid"] for e in doc["entries"]} == {pid}
    r = cli("log", "--json")  # the old name: still works, says so on stderr, keeps its schema
    assert r.returncode == 0 and "is now 'gpuslate audit'" in r.stderr
    assert json.loads(r.stdout)["schema"] == "gpuslate.log.v1"


# -- the walk from a trusted root (issue 15, class F) ------------------------------


def test_fifo_as_the_audit_log_is_refused_not_waited_on(sim_host, hold, cli):
    state = Path(os.environ["GPUSLATE_STATE_DIR"])
    state.mkdir(mode=0o700)
    os.mkfifo(state / "audit.jsonl", 0o600)
    r = cli("audit", timeout=30)  # a blocking open would wait for a writer for ever
    assert r.returncode == 5, (r.stdout, r.stderr)
    assert "audit.jsonl: it is a FIFO, not a regular file" in r.stderr.splitlines()[0]
    h = hold("--gpus", "0", "--memory", "1GiB")
    r = cli("clear", "--gpus", "0", "--yes", "--timeout", "5", timeout=30)
    assert r.returncode == 5, (r.stdout, r.stderr)
    assert "a FIFO, not a regular file" in r.stderr and "no signal was sent" in r.stderr
    assert not is_gone(h.pid)


def test_hard_linked_audit_log_is_not_written(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUSLATE_STATE_DIR", str(tmp_path / "state"))
    log = AuditLog()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("keep\n")
    os.link(elsewhere, log.path)
    with pytest.raises(PermissionDenied, match="2 hard links") as ei:
        log.before_signal(run_id="r", action="clear", signal="SIGTERM", target={"pid": 1})
    assert "no signal was sent" in (ei.value.hint or "")
    assert elsewhere.read_text() == "keep\n"


def test_a_link_of_ours_on_the_way_is_followed_and_its_target_checked(tmp_path, monkeypatch):
    real = tmp_path / "real"
    real.mkdir(mode=0o755)
    (tmp_path / "link").symlink_to(real)  # ours (root's or the user's): followed, like ~ -> /data/home
    monkeypatch.setenv("GPUSLATE_STATE_DIR", str(tmp_path / "link" / "state"))
    assert state_dir() == tmp_path / "link" / "state"
    assert (real / "state").is_dir()
    real.chmod(0o777)  # the target is walked by the same rules as any folder
    with pytest.raises(PermissionDenied, match=r"real is writable by group and others"):
        state_dir()
    real.chmod(0o755)
    # '..' is the parent of the folder actually reached, not of the link's name
    (real / "sub").mkdir()
    monkeypatch.setenv("GPUSLATE_STATE_DIR", str(tmp_path / "link" / "sub" / ".." / "state"))
    assert (state_dir().resolve()) == real / "state"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown")
def test_a_link_another_user_owns_is_refused_wherever_it_is(tmp_path, monkeypatch):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    os.chown(link, OTHER_UID, -1, follow_symlinks=False)
    monkeypatch.setenv("GPUSLATE_STATE_DIR", str(link / "state"))
    with pytest.raises(PermissionDenied, match=f"link is a symbolic link owned by uid {OTHER_UID}"):
        state_dir()
    assert not (real / "state").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown")
def test_a_folder_another_user_owns_above_a_link_is_refused(tmp_path, monkeypatch):
    # the bug: the old check walked up from the resolved path and never saw the user's folder above the link
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, OTHER_UID, -1)
    target = tmp_path / "root-only"
    target.mkdir(mode=0o700)
    (theirs / "state").symlink_to(target)
    os.chown(theirs / "state", 0, 0, follow_symlinks=False)  # even a link owned by root: its folder is theirs
    monkeypatch.setenv("GPUSLATE_STATE_DIR", str(theirs / "state"))
    with pytest.raises(PermissionDenied, match=f"theirs is owned by uid {OTHER_UID}"):
        AuditLog()
    assert list(target.iterdir()) == []


def test_sticky_folders_on_the_way_are_passed_the_state_folder_itself_never_shared(tmp_path, monkeypatch):
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp: others cannot rename what we own in it
    monkeypatch.setenv("GPUSLATE_STATE_DIR", str(shared / "state"))
    assert state_dir() == shared / "state"
    (shared / "state").chmod(0o1777)
    with pytest.raises(PermissionDenied, match="state is writable by group and others"):
        state_dir()
    shared.chmod(0o777)  # not sticky: anyone could swap 'state'
    (shared / "state").chmod(0o700)
    with pytest.raises(PermissionDenied, match="tmp is writable by group and others"):
        state_dir()


def test_state_folders_and_files_are_private_whatever_the_umask(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUSLATE_STATE_DIR", str(tmp_path / "a" / "b" / "state"))
    old = os.umask(0)
    try:
        log = AuditLog()
        log.before_signal(run_id="r", action="clear", signal="SIGTERM", target={"pid": 1})
        unit_records().log_path("web")  # makes units/logs
        write_state_file(unit_records().record_path("web"), b"{}")  # as store.save writes a record
    finally:
        os.umask(old)
    units = unit_records().units_dir()
    for d in (tmp_path / "a", tmp_path / "a" / "b", log.path.parent, units, units / "logs"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    for f in (log.path, unit_records().record_path("web")):
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    assert unit_records().names() == ["web"]


@pytest.mark.parametrize("kind", ["fifo", "socket", "directory"])
def test_only_regular_files_are_state_files(tmp_path, kind):
    import socket

    path = tmp_path / "rec.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
    with pytest.raises(PermissionDenied, match=f"rec.json: it is a {kind if kind != 'fifo' else 'FIFO'}"):
        read_state_file(path)
