"""The fleet's decisions as pure functions: failure names, the wire contract, exit codes, options."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslate import errors
from gpuslate.cli.exits import ExitStatus, exit_status_for, fleet_exit_code
from gpuslate.cli.fleet import remote_command, split_fleet_options
from gpuslate.remote.fleet import interpret, schema_problem
from gpuslate.remote.hosts import HostSpec
from gpuslate.remote.smi import SEPARATOR, status_from_smi
from gpuslate.remote.ssh import SshOptions, SshResult, remote_line, ssh_argv

H = HostSpec("gpu1", "root", 2222)
OPTS = SshOptions(connect_timeout=3, control_dir="/run/user/0/gpuslate-ssh")


def res(rc: int, stdout: str = "", stderr: str = "") -> SshResult:
    return SshResult(rc, stdout, stderr, 0.1)


@pytest.mark.parametrize("stderr,cls,code", [
    ("ssh: connect to host gpu1 port 2222: Connection refused", errors.HostUnreachable, 3),
    ("ssh: Could not resolve hostname gpu1: Name or service not known", errors.HostUnreachable, 3),
    ("root@gpu1: Permission denied (publickey).", errors.HostAuthRefused, 5),
    ("@@@@@@@@@@@\n@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\n@@@@@@@@@@@\n"
     "Host key verification failed.", errors.HostKeyChanged, 5),
    ("No ED25519 host key is known for gpu1 and you have requested strict checking.\n"
     "Host key verification failed.", errors.HostKeyChanged, 5),
    ("Connection timed out during banner exchange", errors.HostTimedOut, 4),
    ("ssh: connect to host gpu1 port 2222: Connection timed out", errors.HostTimedOut, 4),
    ("kex_exchange_identification: Connection closed by remote host", errors.HostUnreachable, 3),
])
def test_ssh_failures_are_named(stderr, cls, code):
    doc, err = interpret(H, res(255, stderr=stderr), OPTS)
    assert doc is None and type(err) is cls and exit_status_for(err) == code
    assert err.message.startswith("root@gpu1:2222: ") and err.hint


@pytest.mark.parametrize("r", [res(127, stderr="bash: line 1: gpuslate: command not found"),
                               res(1, stderr="/usr/bin/python3: No module named gpuslate")])
def test_missing_gpuslate_has_the_install_command(r):
    _, err = interpret(H, r, OPTS)
    assert isinstance(err, errors.GpuslateMissing) and "gpuslate --host HOST install" in (err.hint or "")


def test_documents_and_their_versions():
    ok = {"schema": "gpuslate.status.v1", "gpus": []}
    assert interpret(H, res(0, json.dumps(ok)), OPTS) == (ok, None)
    newer = {"schema": "gpuslate.status.v2"}
    _, err = interpret(H, res(0, json.dumps(newer)), OPTS)
    assert isinstance(err, errors.RemoteIncompatible) and "newer" in err.message and exit_status_for(err) == 2
    _, err = interpret(H, res(0, json.dumps({"schema": "gpuslate.status.v0"})), OPTS)
    assert "older" in err.message
    _, err = interpret(H, res(2, stderr="gpuslate: error: argument COMMAND: invalid choice: 'bench'"), OPTS)
    assert isinstance(err, errors.RemoteIncompatible) and "older" in err.message
    # a command that ran and failed: its own document, its own exit code
    cleared = {"schema": "gpuslate.clear.v1", "status": "timeout"}
    doc, err = interpret(H, res(4, json.dumps(cleared), "gpuslate: error: not free"), OPTS)
    assert doc == cleared and isinstance(err, errors.RemoteCommandFailed) and exit_status_for(err) == 4
    # an error document: its message, hint and code
    e = {"schema": "gpuslate.error.v1", "error": {"type": "usage", "message": "GPU 9 does not exist",
                                                   "hint": None, "exit_code": 2}}
    doc, err = interpret(H, res(2, json.dumps(e)), OPTS)
    assert doc is None and "GPU 9 does not exist" in err.message and exit_status_for(err) == 2
    _, err = interpret(H, res(1, "not json", "Traceback ..."), OPTS)
    assert isinstance(err, errors.RemoteCommandFailed) and exit_status_for(err) == 1


@given(st.text(max_size=30))
def test_schema_problem_never_accepts_foreign_schemas(s):
    if not (s.startswith("gpuslate.") and s.endswith(".v1")):
        assert schema_problem(s) is not None


@given(st.lists(st.sampled_from([0, 2, 3, 4, 5, 6, 7, 130]), min_size=1, max_size=8))
def test_fleet_exit_code(codes):
    code = fleet_exit_code(codes)
    failed = [c for c in codes if c]
    if not failed:
        assert code == 0
    elif len(failed) < len(codes):
        assert code == ExitStatus.PARTIAL
    else:
        assert code == (failed[0] if len(set(failed)) == 1 else ExitStatus.PARTIAL)


@given(st.lists(st.text(min_size=0, max_size=20), max_size=6))
def test_remote_line_is_the_same_words_for_a_shell(words):
    import shlex

    if all("\x00" not in w for w in words):
        assert shlex.split(remote_line(words)) == words


def test_ssh_argv_keeps_the_destination_apart():
    argv = ssh_argv(H, remote_line(["gpuslate", "status", "--json"]), OPTS)
    assert argv[0] == "ssh" and "BatchMode=yes" in argv and "ConnectTimeout=3" in argv
    assert "ControlMaster=auto" in argv and f"ControlPath={OPTS.control_dir}/%C" in argv
    assert argv[argv.index("-p") + 1] == "2222" and argv[argv.index("-l") + 1] == "root"
    assert argv[-3:] == ["--", "gpu1", "gpuslate status --json"]


def test_split_fleet_options_before_and_after_the_command():
    fleet, rest = split_fleet_options(["-H", "a", "status", "--host=b", "-Hc", "--parallel", "4", "--json"])
    assert fleet is not None and fleet.hosts == ["a", "b", "c"] and fleet.parallel == 4
    assert rest == ["status", "--json"]
    fleet, rest = split_fleet_options(["up", "u", "--port", "1", "--", "srv", "--host", "0.0.0.0"])
    assert fleet is None and rest[-2:] == ["--host", "0.0.0.0"]  # after '--': the server's own
    fleet, rest = split_fleet_options(["--sim", "/x", "sim", "serve", "--host", "0.0.0.0"])
    assert fleet is None and "--host" in rest  # sim serve's bind address
    for bad in (["--group", "g", "status"], ["--parallel", "3", "status"], ["status", "-H"],
                ["-H", "a", "--parallel", "x", "status"], ["-H", "a", "--connect-timeout", "-1", "ps"]):
        with pytest.raises(errors.UsageError):
            split_fleet_options(bad)


def test_remote_command():
    """A verb's words written from its typed line (its declaration); another command's as given, with
    --json last before a '--' (after which the words are a unit's command)."""
    from gpuslate.cli.commands import COMMANDS
    from gpuslate.cli.main import build_parser

    def remote(*argv: str) -> list[str]:
        return remote_command(COMMANDS[argv[0]], build_parser(list(argv)).parse_args(list(argv)), argv)

    assert remote("clear", "--json", "--gpus", "0") == ["clear", "--gpus=0", "--json"]
    # the consent given here goes to every host as --yes (nobody there can be asked), where the line needs it
    assert remote("clear", "--yes", "--gpus", "0") == ["clear", "--gpus=0", "--yes", "--json"]
    assert remote("clear", "-y", "--dry-run") == ["clear", "--dry-run", "--json"]
    assert remote("up", "u", "--clear", "-y") == ["up", "u", "--clear", "--yes", "--json"]
    assert remote("down", "u", "--yes") == ["down", "u", "--json"]  # down names its unit: nothing to consent to
    assert remote("clear", "--max-used", "1G") == ["clear", "--max-used=1GiB", "--json"]  # sizes keep their unit
    assert remote("up", "u", "--", "srv", "--json") == ["up", "u", "--json", "--", "srv", "--json"]
    assert remote("logs", "u", "-n", "5") == ["logs", "u", "--tail=5", "--json"]
    assert remote("log", "--limit", "3") == ["log", "--limit=3", "--json"]  # the old name asks for its old document
    assert remote("bench", "http://x", "--json", "-n", "3") == ["bench", "http://x", "-n", "3", "--json"]
    for refused in (("status", "--watch"), ("logs", "u", "-f")):
        with pytest.raises(errors.UsageError, match="does not work with --host"):
            remote(*refused)


def test_status_from_nvidia_smi_csv():
    out = ("0, GPU-a, NVIDIA H200, 2048, 143771, 5, 30, 80.5, 700.00, P0, 580.1\n"
           "1, GPU-b, NVIDIA H200, [N/A], 143771, [N/A], 30, [N/A], 700.00, P0, 580.1\n"
           f"{SEPARATOR}\nGPU-a, 77, 2000, python3\nGPU-a, notapid, 1, x\n")
    doc = status_from_smi("gpu1", out, 0.0, "from nvidia-smi")
    assert doc["source"] == "nvidia-smi" and doc["driver_version"] == "580.1"
    g0, g1 = doc["gpus"]
    assert g0["memory"]["used"] == 2048 * 1024**2 and g0["processes"][0]["pid"] == 77
    assert g1["memory"] is None and g1["error"] and g1["power_w"] is None
    from gpuslate.host.snapshot import Snapshot

    snap = Snapshot.from_json(doc)  # renders like any status document
    assert snap.gpus[0].processes[0].used_memory == 2000 * 1024**2


def test_control_dir_is_private(tmp_path, monkeypatch):
    import os
    import stat

    from gpuslate.errors import PermissionDenied
    from gpuslate.remote.ssh import control_dir

    monkeypatch.setenv("GPUSLATE_SSH_CONTROL_DIR", str(tmp_path / "cm"))
    d = control_dir()
    assert stat.S_IMODE(os.lstat(d).st_mode) == 0o700
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    monkeypatch.setenv("GPUSLATE_SSH_CONTROL_DIR", str(tmp_path / "link"))
    with pytest.raises(PermissionDenied, match="not a link"):
        control_dir()  # never followed through a link
    (tmp_path / "open").mkdir(mode=0o777)
    os.chmod(tmp_path / "open", 0o777)
    monkeypatch.setenv("GPUSLATE_SSH_CONTROL_DIR", str(tmp_path / "open"))
    with pytest.raises(PermissionDenied):
        control_dir()  # others could reach the sockets


@given(st.lists(st.sampled_from(["status", "clear", "--json", "--gpus", "0-3", "--yes", "-n", "5", "x"]),
                max_size=8),
       st.lists(st.tuples(st.integers(0, 8), st.sampled_from(["-H", "--host", "--hosts", "--group"]),
                          st.from_regex(r"[a-z][a-z0-9]{0,6}", fullmatch=True)), max_size=4),
       st.booleans())
def test_split_fleet_options_takes_only_its_own(words, options, joined):
    """Wherever the fleet options are put (before ``--``), they come off, the rest stays in order."""
    argv = list(words)
    for pos, opt, value in sorted(options, reverse=True):
        at = min(pos, len(words))  # a boundary between the original words: pairs stay whole
        argv[at:at] = [f"{opt}={value}"] if joined else [opt, value]
    try:
        fleet, rest = split_fleet_options(argv)
    except errors.UsageError:  # --group without any host: refused, never guessed
        assert all(o == "--group" for _, o, _ in options) and options
        return
    assert rest == words
    hosts = [v for _, o, v in sorted(options, reverse=True) if o in ("-H", "--host")]
    assert (fleet is None) == (not hosts and not any(o == "--hosts" for _, o, _ in options))
    if fleet is not None:
        assert sorted(fleet.hosts) == sorted(hosts)


def test_how_long_a_host_may_take_is_its_commands_row(monkeypatch):
    """The answer's time limit: none for a command whose length the host decides (its row's ``paced``),
    else --connect-timeout + its own --timeout and --grace + the margin. restart waits for its server
    to load again (up to its unit's start timeout) as up and swap do: a separate list of such commands
    had left it out, and a remote restart of a slow server was cut at 70 s."""
    from gpuslate.cli.commands import COMMANDS, Remote
    from gpuslate.cli.fleet import answer_limit
    from gpuslate.cli.main import build_parser

    monkeypatch.setenv("GPUSLATE_ANSWER_MARGIN", "60")

    def limit(*words: str) -> float | None:
        return answer_limit(COMMANDS[words[0]], build_parser(list(words)).parse_args(list(words)), 10.0)

    for words in (("up", "web"), ("down", "web"), ("swap", "a", "b"), ("restart", "web"), ("bench", "http://x"),
                  ("experiment", "run", "x.toml"), ("demo",)):
        assert limit(*words) is None, words
    assert limit("clear", "--yes") == 10 + 60 + 10 + 60  # its --timeout 60 and --grace 10
    assert limit("wait", "--free", "--timeout", "5") == 10 + 5 + 60
    assert limit("status") == limit("ps") == limit("rm", "web") == limit("experiment", "report", "d") == 70
    assert {n for n, c in COMMANDS.items() if c.remote is Remote.ROLLING} == {"swap", "restart"}
