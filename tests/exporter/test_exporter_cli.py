"""``gpuslate exporter`` as a real process on a simulated host, scraped over loopback HTTP.

The holders are real processes (``gpuslate sim hold``, a unit started by ``gpuslate up``);
every scrape is parsed by prometheus_client's own parser.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from exportkit import Exporter, process_series, value
from gpuslate.extras import Extra, install_hint
from helpers import GiB, gpuslate_env, run_cli, wait_for


def status_processes(sim_host) -> dict[tuple[int, int], dict]:
    r = run_cli("--sim", str(sim_host.root), "status", "--json")
    assert r.returncode == 0, r.stderr
    return {(g["index"], p["pid"]): p for g in json.loads(r.stdout)["gpus"] for p in g["processes"]
            if p["kind"] != "handle"}


def test_exposition_parses_and_matches_status(sim_host, hold, exporter):
    """Per-process series: bytes, user, job (root pid and command) and unit, as `status --json`
    and `ps` show the same host state."""
    job = hold("--memory", "8GiB", "--gpus", "0-3", "--workers", "4", "--title", "sglang::scheduler_TP{rank}")
    lone = hold("--memory", "3GiB", "--gpus", "5")
    r = run_cli("up", "web", "--gpus", "6", "--ready-log", '"ready": true', "--json", "--",
                sys.executable, "-m", "gpuslate", "sim", "hold", "--memory", "2GiB", "--gpus", "6", "--workers", "1")
    assert r.returncode == 0, r.stderr
    unit_pid = json.loads(r.stdout)["pid"]
    try:
        e = exporter()
        samples = e.scrape()
        series = process_series(samples)
        procs = status_processes(sim_host)
        assert series.keys() == procs.keys() and len(series) == 4 + 1 + 1
        for key, p in procs.items():
            s = series[key]
            assert int(s["bytes"]) == p["used_memory"] and s["user"] == p["user"] and s["kind"] == p["kind"]
            assert int(s["job_pid"]) == p["root_pid"] and s["command"] == p["command"]
        for w in job.workers:  # the launcher holds no GPU: the workers' job is it, by its command line
            s = next(v for (g, pid), v in series.items() if pid == w)
            assert int(s["job_pid"]) == job.pid and "sim hold" in s["job_command"] and s["unit"] == ""
            assert s["command"].startswith("sglang::scheduler_TP") and s["orphaned"] == "false"
        assert series[(5, lone.pid)]["job_command"] == series[(5, lone.pid)]["command"]
        (unit_series,) = [v for (g, _), v in series.items() if g == 6]
        assert unit_series["unit"] == "web" and int(unit_series["job_pid"]) == unit_pid
        assert int(unit_series["bytes"]) == 2 * GiB

        for g in range(8):
            used = {0: 8, 1: 8, 2: 8, 3: 8, 5: 3, 6: 2}.get(g, 0) * GiB
            assert value(samples, "gpuslate_gpu_memory_used_bytes", gpu=str(g)) == used
            assert value(samples, "gpuslate_gpu_memory_total_bytes", gpu=str(g)) == 96 * GiB
            assert value(samples, "gpuslate_gpu_leaked_memory_bytes", gpu=str(g)) == 0
            assert value(samples, "gpuslate_gpu_read_error", gpu=str(g)) == 0
            assert value(samples, "gpuslate_gpu_pstate", gpu=str(g)) == (0 if used else 8)
        assert value(samples, "gpuslate_unit_ready", unit="web") == 1
        assert value(samples, "gpuslate_unit_state", unit="web", state="ready") == 1
        assert value(samples, "gpuslate_unit_state", unit="web", state="orphaned") == 0
        assert value(samples, "gpuslate_unit_memory_bytes", unit="web") == 2 * GiB
        assert value(samples, "gpuslate_unit_uptime_seconds", unit="web") > 0
        assert value(samples, "gpuslate_exporter_reading_ok") == 1
        assert value(samples, "gpuslate_exporter_scrape_errors_total", stage="reading") == 0
        assert 0 < value(samples, "gpuslate_exporter_scrape_duration_seconds") < 5

        # `down` (through the audit log): the unit's stop and its signals by outcome, counted incrementally
        assert run_cli("down", "web").returncode == 0
        after = e.scrape()
        assert value(after, "gpuslate_unit_stops_total", unit="web", action="down") == 1
        assert value(after, "gpuslate_signals_total", action="down", signal="SIGTERM") == 2
        assert value(after, "gpuslate_signal_outcomes_total", action="down", signal="SIGTERM",
                     outcome="delivered") == 2
        assert value(after, "gpuslate_unit_state", unit="web", state="stopped") == 1
        assert value(after, "gpuslate_clear_runs_total") == 0
        r = run_cli("clear", "--gpus", "5", "--yes", "--json")
        assert r.returncode == 0, r.stderr
        again = e.scrape()
        assert value(again, "gpuslate_clear_runs_total") == 1
        assert value(again, "gpuslate_signals_total", action="clear", signal="SIGTERM") == 1
        assert value(again, "gpuslate_unit_stops_total", unit="web", action="down") == 1  # not counted twice
        assert not any(pid == lone.pid for _, pid in process_series(again))
    finally:
        run_cli("down", "web")


def test_a_holder_that_dies_is_gone_from_the_next_scrape(sim_host, hold, exporter):
    a = hold("--memory", "4GiB", "--gpus", "0")
    b = hold("--memory", "4GiB", "--gpus", "1")
    e = exporter()
    assert {pid for _, pid in process_series(e.scrape())} == {a.pid, b.pid}
    a.kill()
    a.proc.wait(5)
    # the simulated driver releases a dead holder's memory 0.2 s after its death is first seen
    wait_for(lambda: {pid for _, pid in process_series(e.scrape())} == {b.pid}, timeout=10, interval=0.05)
    samples = e.scrape()
    assert value(samples, "gpuslate_gpu_memory_used_bytes", gpu="0") == 0
    assert value(samples, "gpuslate_gpu_memory_holders", gpu="0") == 0


def test_leaked_context_and_orphaned_workers(sim_host, hold, exporter, cli):
    """`sim leak` shows as leaked memory; workers whose launcher exited as orphaned memory."""
    assert cli("--sim", str(sim_host.root), "sim", "leak", "--gpu", "2", "--memory", "3GiB").returncode == 0
    job = hold("--memory", "6GiB", "--gpus", "4,5", "--workers", "2", "--orphan-workers")
    e = exporter()
    samples = e.scrape()
    assert value(samples, "gpuslate_gpu_leaked_memory_bytes", gpu="2") == 3 * GiB
    assert value(samples, "gpuslate_gpu_memory_used_bytes", gpu="2") == 3 * GiB
    assert value(samples, "gpuslate_gpu_memory_holders", gpu="2") == 0
    # reparented away from a launcher that still lives: attributed to it, not orphaned
    assert value(samples, "gpuslate_gpu_orphaned_memory_bytes", gpu="4") == 0
    assert all(int(s["job_pid"]) == job.pid for s in process_series(samples).values())

    os.kill(job.pid, signal.SIGKILL)  # the launcher dies; its workers hold on
    job.proc.wait(5)
    samples = e.scrape()
    for g in ("4", "5"):
        assert value(samples, "gpuslate_gpu_orphaned_memory_bytes", gpu=g) == 6 * GiB
        assert value(samples, "gpuslate_gpu_orphaned_processes", gpu=g) == 1
        assert value(samples, "gpuslate_gpu_leaked_memory_bytes", gpu=g) == 0
    series = process_series(samples)
    assert {pid for _, pid in series} == set(job.workers)
    assert all(s["orphaned"] == "true" and int(s["job_pid"]) == int(s["pid"]) for s in series.values())
    assert value(samples, "gpuslate_gpu_orphaned_memory_bytes", gpu="2") == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="a simulated MPS server is a GPU daemon when root's")
def test_an_mps_host_with_no_clients_is_free_and_clients_name_their_server(sim_host, hold, exporter):
    server = hold("--gpus", "0,1", verb="mps")
    client = hold("--gpus", "1", "--memory", "2GiB", "--mps")
    samples = exporter().scrape()
    assert value(samples, "gpuslate_gpu_free", gpu="0") == 1 and value(samples, "gpuslate_gpu_free", gpu="1") == 0
    assert value(samples, "gpuslate_gpu_free", gpu="2") == 1
    assert value(samples, "gpuslate_gpu_daemon_memory_bytes", gpu="0") == 66 * 2**20
    assert value(samples, "gpuslate_gpu_daemon_memory_bytes", gpu="2") == 0
    series = process_series(samples)
    assert series[(1, client.pid)]["kind"] == "mps" and series[(1, client.pid)]["mps_server"] == str(server.pid)
    assert series[(0, server.pid)]["kind"] == "compute" and series[(0, server.pid)]["mps_server"] == ""


HOSTILE = ['q"uote', "back\\slash\\", "new\nline", "esc\x1b[2J\x1b[31mred", "tab\there", "}{=,#",
           "é€\u202eright-to-left", "x" * 5000]


@pytest.mark.parametrize("title", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_titles_cannot_break_the_exposition(sim_host, hold, exporter, title):
    h = hold("--memory", "1GiB", "--gpus", "3", "--title", title)
    other = hold("--memory", "1GiB", "--gpus", "4")
    e = exporter()
    status, _, text = e.get()
    assert status == 200 and "\x1b" not in text
    series = process_series(e.scrape())  # the parser reads every line back
    assert {pid for _, pid in series} == {h.pid, other.pid}
    s = series[(3, h.pid)]
    assert "\x1b" not in s["command"] and "\n" not in s["command"] and len(s["command"]) <= 200
    assert s["command"] == s["job_command"]
    assert series[(4, other.pid)]["bytes"] == str(GiB)
    # every line of the body is a comment or one sample: nothing a title wrote starts a line of its own
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert all(ln.startswith("gpuslate_") for ln in lines)


def test_healthz_index_404_and_head(sim_host, exporter):
    e = exporter()
    assert e.get("/healthz") == (200, "text/plain; charset=utf-8", "ok\n")
    assert e.get("/")[0] == 200 and e.get("/nope")[0] == 404
    status, ctype, _ = e.get("/metrics?x=1")
    assert status == 200 and ctype.startswith("text/plain; version=0.0.4")
    req = urllib.request.Request(e.url + "/metrics", method="HEAD")
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200 and int(r.headers["Content-Length"]) > 0 and r.read() == b""
    req = urllib.request.Request(e.url + "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.headers["Content-Type"].startswith("application/openmetrics-text")
        assert r.read().decode().endswith("# EOF\n")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_sigint_stop_it_cleanly(sim_host, sig):
    e = Exporter(env={"GPUSLATE_SIM": str(sim_host.root)})
    assert e.get("/healthz")[0] == 200
    assert e.stop(sig) == 0
    assert e.proc.stderr.read() == ""  # type: ignore[union-attr]
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", e.port), timeout=2).close()


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


@pytest.mark.parametrize("listen, fragment", [
    ("0.0.0.0:9847", "not a loopback address"),
    ("[::]:9847", "not a loopback address"),
    ("192.0.2.1:9847", "not a loopback address"),
    ("example.com:9847", "is not an IP address"),
    ("9847", "expected ADDR:PORT"),
    (":9847", "expected ADDR:PORT"),
    ("127.0.0.1:65536", "the port must be a number"),
    ("127.0.0.1:-1", "the port must be a number"),
    ("127.0.0.1:٣", "the port must be a number"),
])
def test_bad_listen_is_refused_before_anything_starts(sim_host, cli, listen, fragment):
    r = cli("exporter", "--listen", listen, timeout=20)
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.splitlines()
    assert lines[0].startswith("gpuslate: error:") and fragment in lines[0] and "Traceback" not in r.stderr
    if "loopback" in fragment:
        assert "--allow-remote" in r.stderr


def test_remote_listen_needs_allow_remote_and_then_serves(sim_host, cli):
    e = Exporter("--listen", "0.0.0.0:0", "--allow-remote", env={"GPUSLATE_SIM": str(sim_host.root)})
    try:
        assert e.doc["address"] == "0.0.0.0" and e.get("/healthz")[0] == 200
    finally:
        assert e.stop() == 0


def test_port_in_use_exit_2_and_json_error(sim_host, cli):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = cli("exporter", "--listen", f"127.0.0.1:{port}", "--json", timeout=20)
    assert r.returncode == 2 and "cannot listen on 127.0.0.1:" in r.stderr and "Traceback" not in r.stderr
    assert json.loads(r.stdout)["error"]["exit_code"] == 2


def test_no_simulated_host_exit_3(tmp_path, cli):
    r = cli("--sim", str(tmp_path / "none"), "exporter", timeout=20)
    assert r.returncode == 3 and "no simulated host" in r.stderr


def test_not_with_host(cli):
    r = cli("-H", "nosuchhost.invalid", "exporter", timeout=20)
    assert r.returncode == 2 and "start it on each host" in r.stderr


def test_scrape_of_a_stuck_driver_answers_in_time(sim_host, hold, exporter):
    """A reading that hangs (here the simulated driver's DIR/stuck FIFO that nobody writes, so
    the driver's read blocks for real) answers within --scrape-timeout with the error counted,
    keeps answering while stuck, and reads afresh once the driver answers."""
    h = hold("--memory", "1GiB", "--gpus", "0")
    e = exporter("--scrape-timeout", "1")
    assert value(e.scrape(), "gpuslate_exporter_reading_ok") == 1
    fifo = sim_host.root / "stuck"
    os.mkfifo(fifo)
    try:
        for n in (1, 2):
            samples = e.scrape()
            assert value(samples, "gpuslate_exporter_reading_ok") == 0
            assert value(samples, "gpuslate_exporter_scrape_errors_total", stage="timeout") == n
            assert value(samples, "gpuslate_exporter_scrape_duration_seconds") < 3
            assert "gpuslate_process_memory_bytes" not in samples
        fd = os.open(fifo, os.O_WRONLY)  # the stuck reader is released and goes on
        os.close(fd)
    finally:
        fifo.unlink(missing_ok=True)
    samples = wait_for(lambda: (s := e.scrape()) and value(s, "gpuslate_exporter_reading_ok") == 1 and s,
                       timeout=10, interval=0.05)
    assert {pid for _, pid in process_series(samples)} == {h.pid}


def test_help_states_exit_codes_and_every_option_and_the_readme_defaults(capsys):
    from test_help import help_of, subparser

    text = " ".join(help_of(["exporter"], capsys).split())
    assert "exit status: 0 stopped by SIGTERM or Ctrl-C; 2 bad input" in text and "130 interrupted" in text
    parser = subparser(["exporter"])
    assert all(a.help for a in parser._actions if a.option_strings)
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `exporter "))
    args = parser.parse_args([])
    assert "[--scrape-timeout 5]" in row and args.scrape_timeout == 5.0
    assert "127.0.0.1:9847" in row and args.listen == "127.0.0.1:9847"


def test_without_prometheus_client_one_line_and_exit_2(sim_host):
    code = ("import sys; sys.modules['prometheus_client'] = None; from gpuslate.cli.main import main; "
            "sys.exit(main(['exporter']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30,
                       env=gpuslate_env())
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == ["gpuslate: error: gpuslate exporter needs prometheus_client, which is not "
                                     "installed", f"gpuslate: hint: {install_hint(Extra.EXPORTER)}"]
    assert "'gpuslate[" not in r.stderr  # no name that is not published


def test_an_unreadable_audit_log_is_counted_and_the_gpus_still_shown(sim_host, hold, exporter, tmp_path):
    h = hold("--memory", "1GiB", "--gpus", "0")
    e = exporter()
    fifo = tmp_path / "state" / "audit.jsonl"  # the state folder of the sim_host fixture
    os.mkfifo(fifo)  # a FIFO must not block a scrape: refused, counted
    try:
        samples = e.scrape()
        assert value(samples, "gpuslate_exporter_scrape_errors_total", stage="audit") == 1
        assert value(samples, "gpuslate_exporter_reading_ok") == 1
        assert {pid for _, pid in process_series(samples)} == {h.pid}
    finally:
        fifo.unlink()
    assert value(e.scrape(), "gpuslate_exporter_scrape_errors_total", stage="audit") == 1  # not counted again


def test_a_restarted_unit_has_a_new_launch_time(sim_host, exporter):
    """Restarts and swaps are counted in PromQL as changes() of the launch time."""
    def up() -> None:
        r = run_cli("up", "web", "--gpus", "2", "--ready-log", '"ready": true', "--", sys.executable, "-m", "gpuslate",
                    "sim", "hold", "--memory", "1GiB", "--gpus", "2", "--workers", "1")
        assert r.returncode == 0, r.stderr

    e = exporter()
    try:
        up()
        first = value(e.scrape(), "gpuslate_unit_launch_time_seconds", unit="web")
        assert run_cli("down", "web").returncode == 0
        up()
        samples = e.scrape()
        assert value(samples, "gpuslate_unit_launch_time_seconds", unit="web") > first
        assert value(samples, "gpuslate_unit_stops_total", unit="web", action="down") == 1
        assert value(samples, "gpuslate_unit_ready", unit="web") == 1
        assert 0 < value(samples, "gpuslate_unit_time_to_ready_seconds", unit="web") < 30
    finally:
        run_cli("down", "web")
