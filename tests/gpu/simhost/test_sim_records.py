"""The simulated driver's decisions about records, as pure functions of gathered facts
(owner_of, parse_claim), and the kernel facts they are gathered from (flock, /proc/locks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslate.gpu.simhost.records import (
    START_SLACK,
    Claim,
    LockFact,
    RecordFile,
    lock_owners,
    owner_of,
    parse_claim,
    read_record,
)
from gpuslate.host.statedir import Trust, open_dir
from gpuslate.proc.fdscan import FdScan

REC = "/sim/alloc/g0.x.json"
DEV = "/sim/dev/nvidia0"
OTHER = ["/sim/dev/nvidia1", "/sim/alloc/g1.y.json", "/sim/dev/nvidiactl"]
CREATED = 1000.0

pids = st.integers(1, 60)
targets = st.frozensets(st.sampled_from([REC, DEV, *OTHER]), max_size=4)
locks = st.one_of(st.none(), st.builds(
    LockFact, pid=pids, start_ticks=st.one_of(st.none(), st.integers(0, 5)),
    started=st.one_of(st.none(), st.floats(CREATED - 10, CREATED + 10)), targets=st.one_of(st.none(), targets)))


@settings(max_examples=500, deadline=None)
@given(holders=st.dictionaries(pids, targets, max_size=8), unreadable=st.lists(pids, max_size=5),
       starts=st.dictionaries(pids, st.one_of(st.none(), st.integers(0, 5)), max_size=60), lock=locks,
       scanned=st.booleans())
def test_owner_is_the_kernels_locker_or_a_holder_of_both_files_never_a_guess(
        holders, unreadable, starts, lock, scanned):
    record = RecordFile("g0.x.json", REC, Claim(0, 1, 0, 5, "compute"), True, (1, 2), CREATED)
    scan = FdScan(holders, unreadable) if scanned else None
    owner = owner_of(record, DEV, lock, scan, starts)
    both = [p for p, t in holders.items() if REC in t and DEV in t] if scanned else []
    lock_counts = (lock is not None and lock.start_ticks is not None and lock.started is not None
                   and lock.started <= CREATED + START_SLACK
                   and (lock.targets is None or {REC, DEV} <= lock.targets))
    if lock_counts:
        # the locker: started before the record was written, and holds both files or cannot be inspected
        assert owner == (lock.pid, lock.start_ticks)
    elif both:
        # else the holder of both that started first (unknown start last), lowest pid among equals
        key = min((starts.get(p) if starts.get(p) is not None else 1 << 62, p) for p in both)
        assert owner is not None and owner.pid == key[1]
    else:
        assert owner is None  # unknown never names a process; the record's claim (pid 1) never does


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=200),
                 st.dictionaries(st.sampled_from(["gpu", "pid", "start_ticks", "bytes", "kind", "x"]),
                                 st.one_of(st.none(), st.booleans(), st.integers(-5, 1 << 62), st.text(max_size=8),
                                           st.sampled_from(["compute", "handle", "mps"])))
                 .map(lambda d: json.dumps(d).encode())))
def test_parse_claim_never_raises_and_accepts_only_valid_records(data):
    got = parse_claim(data, gpus=4)
    if isinstance(got, Claim):
        assert 0 <= got.gpu < 4 and got.bytes >= 0 and got.kind in ("compute", "graphics", "mps")
        assert got.claimed_pid is None or got.claimed_pid >= 1
    else:
        assert isinstance(got, str) and got


def test_a_record_is_live_exactly_while_its_holder_keeps_it(tmp_path):
    """The flock of create_record is what read_record sees, from another process; /proc/locks names it."""
    code = ("import sys; from gpuslate.gpu.simhost.records import Claim, create_record;"
            "from gpuslate.host.statedir import Trust, open_dir;"
            "fd = create_record(open_dir(sys.argv[1], trust=Trust.SHARED), 'g0.t.json', Claim(0, 99, 0, 5, 'compute'));"
            "print('ready', flush=True); sys.stdin.read()")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, env=env)
    try:
        assert p.stdout.readline() == "ready\n"
        with open_dir(tmp_path, trust=Trust.SHARED) as alloc:
            rec = read_record(alloc, "g0.t.json", str(tmp_path), 1)
            assert rec.locked and rec.claim.claimed_pid == 99
            assert lock_owners([rec.inode]) == {rec.inode: p.pid}  # the kernel's pid, not the claim
            p.stdin.close()
            assert p.wait(10) == 0
            rec = read_record(alloc, "g0.t.json", str(tmp_path), 1)
            assert not rec.locked and lock_owners([rec.inode]) == {}
    finally:
        p.kill()
        p.wait()
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]  # no temporary left behind
