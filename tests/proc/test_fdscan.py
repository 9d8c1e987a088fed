"""The fd scan reads a live thread's table where the leader thread has exited (issue 24): its own
``/proc/PID/fd`` is then empty though the process holds the device files."""

from __future__ import annotations

import os

import pytest

from gpuslate.proc.fdscan import fd_dir, read_fd_targets, scan_device_holders, thread_fd_dir
from gpuslate.proc.procfs import list_pids, read_stat
from helpers import leader_exits


def test_a_process_whose_leader_exited_holds_what_its_threads_hold(tmp_path):
    dev = tmp_path / "nvidia0"
    dev.write_text("")
    with leader_exits(f"held = open({str(dev)!r})") as p:
        st = read_stat(p.pid)
        assert thread_fd_dir(p.pid) == f"/proc/{p.pid}/task/{st.live_task}/fd/" == fd_dir(p.pid)
        assert str(dev) in read_fd_targets(p.pid)
        assert scan_device_holders((str(tmp_path) + "/",)).holders == {p.pid: {str(dev)}}


def test_one_thread_with_an_empty_table_costs_no_second_look():
    """A kernel thread (an empty table, one task): told by the link count of its task folder."""
    kthreads = [p for p in list_pids() if (st := read_stat(p)) is not None and st.is_kernel_thread]
    if not kthreads:
        pytest.skip("no kernel thread in this PID namespace")
    k = kthreads[0]
    assert os.listdir(f"/proc/{k}/fd") == [] and thread_fd_dir(k) is None and fd_dir(k) == f"/proc/{k}/fd/"
