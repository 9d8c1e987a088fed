"""The `status` table without rich: nothing heavy on its import path, control characters
from process titles never reach the terminal, and a narrow terminal cuts only text columns."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from gpuslate.cli.render.status import status_lines
from gpuslate.gpu.simhost import SimBackend
from gpuslate.host.snapshot import take_snapshot
from helpers import gpuslate_env

SGR = re.compile(r"\x1b\[[0-9;]*m")


def imported_modules(*args: str) -> set[str]:
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "gpuslate", *args], capture_output=True,
                       text=True, env=gpuslate_env(), timeout=60)
    assert r.returncode == 0, r.stderr
    return {line.rsplit("|", 1)[1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize("args", [("status",), ("status", "--json")])
def test_status_imports_neither_rich_nor_the_other_commands(sim_host, args):
    mods = imported_modules(*args)
    assert "gpuslate.host.snapshot" in mods  # the probe does see gpuslate's imports
    heavy = {m for m in mods if m.split(".")[0] in ("rich", "aiohttp", "psutil", "asyncio")}
    assert not heavy, heavy
    assert not {m for m in mods if m.startswith(("gpuslate.clearing", "gpuslate.units", "gpuslate.bench"))}


def test_escape_sequences_in_titles_are_neutralised(sim_host, hold, cli):
    hold("--gpus", "0", "--memory", "1GiB", "--workers", "1", "--title", "evil\x1b[2J\x07title{rank}")
    r = cli("status")
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout  # piped: no colour, no control characters
    assert "evil\\x1b[2J\\x07title0" in r.stdout  # shown as escapes, not sent


def test_narrow_terminal_cuts_only_name_and_command(sim_host, hold):
    hold("--gpus", "0,1", "--memory", "3GiB", "--workers", "2", "--title", "a-very-long-title-" * 6 + "{rank}")
    snap = take_snapshot(SimBackend(sim_host.root))
    lines = status_lines(snap, color=True, width=60)
    visible = [SGR.sub("", ln) for ln in lines]
    assert all("\x1b" not in ln for ln in visible)
    table_lines = visible[1:]  # the head line is not a table
    assert max(len(ln) for ln in table_lines) <= 60, table_lines
    assert sum("3.0 GiB/96.0 GiB" in ln for ln in visible) == 2  # numbers whole
    assert any("…" in ln and "compute" in ln for ln in visible)  # the command was cut
    wide = status_lines(snap, color=False, width=None)  # piped: nothing cut but at 100 characters
    assert not any("\x1b" in ln for ln in wide)
    assert any("a-very-long-title-" * 5 in ln for ln in wide)


def test_watch_table_redraws_until_ctrl_c(sim_host, hold):
    import signal

    hold("--gpus", "1", "--memory", "2GiB")
    proc = subprocess.Popen([sys.executable, "-m", "gpuslate", "status", "--watch", "0.05"],
                            stdout=subprocess.PIPE, text=True, env=gpuslate_env())
    try:
        heads = 0
        while heads < 3:  # one table per refresh; piped, so no screen clearing
            line = proc.stdout.readline()  # type: ignore[union-attr]
            assert line, "the watch ended by itself"
            assert "\x1b" not in line
            heads += line.startswith("GPU Name")
    finally:
        proc.send_signal(signal.SIGINT)
        # read what it wrote meanwhile: a watch blocked on a full pipe cannot exit (its last flush)
        proc.communicate(timeout=60)
        assert proc.returncode == 0


def test_cpu_host_memory_and_elapsed_where_the_command_keeps_room(sim_host, hold):
    """Shown where the command keeps 30 columns with them (always when piped), left out where not:
    PIDs, users, GPUs and the command come first."""
    h = hold("--gpus", "0,1", "--memory", "3GiB", "--workers", "2", "--title", "sglang::scheduler_TP{rank}")
    snap = take_snapshot(SimBackend(sim_host.root))
    for width, shown in ((None, True), (120, True), (80, False), (60, False)):
        lines = [SGR.sub("", ln) for ln in status_lines(snap, color=False, width=width)]
        head = next(ln for ln in lines if ln.startswith("GPU ") and "PID" in ln)
        assert ("CPU Host mem Elapsed Command" in head) == shown, (width, head)
        row = next(ln for ln in lines if f"└ {h.workers[0]} " in ln)
        assert bool(re.search(r" \d+% +\d+\.\d MiB +\d+\.\ds sglang::", row)) == shown, (width, row)


def test_a_document_without_the_new_figures_reads_as_unknown_and_bad_ones_are_refused(sim_host, hold):
    """A gpuslate before them (``--host``): absent, unknown. A peer's document is never trusted
    beyond what it is: a negative, a string or a bool is that host's bad document (issue 32)."""
    from gpuslate.errors import BadDocument
    from gpuslate.host.snapshot import Snapshot

    hold("--gpus", "0", "--memory", "1GiB")
    doc = take_snapshot(SimBackend(sim_host.root)).to_json()
    for bad in ({}, {"cpu_time_s": -1}, {"host_memory": "9"}, {"cpu_time_s": True}, {"host_memory": 1.5}):
        for g in doc["gpus"]:
            for p in g["processes"]:
                p.pop("cpu_time_s", None)
                p.pop("host_memory", None)
                p.update(bad)
        if bad:
            with pytest.raises(BadDocument):
                Snapshot.from_json(doc)
            continue
        snap = Snapshot.from_json(doc)
        p = snap.gpus[0].processes[0]
        assert p.cpu_time_s is None and p.host_memory is None and p.cpu_pct(snap.taken_at) is None
        lines = status_lines(snap, color=False, width=None)
        assert any(re.search(rf"{p.pid} compute +1\.0 GiB \S+ +- +- +\S+ ", ln) for ln in lines), lines
