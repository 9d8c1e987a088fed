"""The fuzzer's driver: runs inside a private PID and mount namespace, one forest after another.

Started as ``unshare --fork --pid --mount-proc --kill-child python driver.py ARGS`` (see
tests/clearing/test_fuzz_forests.py). As the namespace's PID 1 it forks the real driver and stays a
plain reaper, like ``tini``: orphans (double forks, leaders that exit) are reaped by it, and when
the driver ends, or the test kills ``unshare``, the kernel ends every process of the namespace.

For each forest (seed ``SEED + i``) the driver forks a *caller* (a fresh pid each time; with
``--driver-pid2`` the driver itself, PID 2, is the caller), which enters one of four group
contexts (:data:`CONTEXTS`), makes a fresh simulated host and state folder, starts the forest
(:mod:`fuzzkit.node`; its roots are the caller's children), reads its facts from /proc, draws a
selection, runs ``clear`` as a dry run and then for real (through the library in-process, or the
CLI for every 20th forest), reads the facts after the act, checks the invariants
(:mod:`fuzzkit.checks`) and kills everything; then the driver sweeps whatever is left. One JSON
line per forest goes to ``OUT/results.jsonl``.

With the library, ``confirm`` (called between the plan and the act) is the hook that reuses a PID:
it kills a planned target, waits for its pid to be free, and forks a bystander onto that very pid
by writing ``/proc/sys/kernel/ns_last_pid`` (PIDs in a fresh namespace are small and predictable).

Every death is explained where the kernel tells it: each process's wait status, from whoever reaped
it (the namespace's init logs what it reaps to ``OUT/reaped.log``; nodes and the caller report
theirs), goes into a collateral death's message ("killed by SIGHUP": the kernel's, for an orphaned
group with a stopped member or a terminal hung up; gpuslate's signals are in the audit log).
The GPU daemons' programs (:data:`fuzzkit.forest.MPS_SERVER`...) are copies of this interpreter,
made once a run under ``OUT/programs``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import select
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, NoReturn

sys.path[:0] = [str(Path(__file__).resolve().parents[2] / "src"), str(Path(__file__).resolve().parents[1])]

import gpuslate  # noqa: E402
from fuzzkit import checks  # noqa: E402
from fuzzkit.forest import GPUS, MPS_CONTROL, MPS_SERVER, Forest, NodeSpec, Rename, generate  # noqa: E402
from fuzzkit.node import Node  # noqa: E402
from gpuslate.errors import GpuslateError  # noqa: E402
from gpuslate.gpu.simhost.host import SimHost  # noqa: E402
from gpuslate.proc.procfs import ProcessId, list_pids, read_stat  # noqa: E402
from gpuslate.proc.signals import send_signal  # noqa: E402
from helpers import program_named  # noqa: E402

GiB = 1024**3
GRACE = 0.2
TIMEOUT = 4.0
#: how long a death caused by the act (a forwarded SIGTERM, a namespace's end) is looked for after it
SETTLE_S = 0.1
#: a forest that takes longer than this is reported as a fuzzer error (it normally takes under 1 s)
CALLER_TIMEOUT_S = 90  # more than a forest's start-up deadline: a hung start-up is retried, not lost
#: the interpreter the second user's exec'd processes run (this one may live in root's home)
PYTHON_OTHER = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
#: what the namespace's init reaps (pid and wait status, a line each), under OUT; and the programs
REAPED_LOG, PROGRAMS = "reaped.log", "programs"


# --- facts ----------------------------------------------------------------------------------


def proc_facts(pid: int) -> dict[str, Any] | None:
    """What /proc says about ``pid`` (fields gpuslate decides on), or None."""
    st = read_stat(pid)
    if st is None:
        return None
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
        ns = os.readlink(f"/proc/{pid}/ns/pid")
        nspid = _status_field(pid, "NSpid")
        # what --match reads (a title only where setproctitle is), a live thread's where the leader exited
        with open(f"{st.image_dir}/cmdline", "rb") as f:
            cmdline = " ".join(a.decode(errors="replace") for a in f.read(8192).split(b"\0") if a)
    except OSError:
        return None
    return {"pid": pid, "ticks": st.start_ticks, "ppid": st.ppid, "pgid": st.pgid, "sid": st.sid, "tty": st.tty_nr,
            "uid": uid, "cmdline": cmdline, "leader_exited": st.leader_exited,
            "name": st.name, "state": st.state, "ns": ns, "nspid": nspid}


def _status_field(pid: int, key: str) -> str:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return line.split(":", 1)[1].strip()
    return ""


def system_library() -> str:
    """A library of the system this interpreter maps (libc): what a look-alike daemon preloads."""
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split(maxsplit=5)[-1].strip()
            if "/libc.so" in path or "/libc-" in path:
                return path
    return "/lib/x86_64-linux-gnu/libc.so.6"


def alive(ident: tuple[int, int]) -> bool:
    st = read_stat(ident[0])
    return st is not None and st.start_ticks == ident[1] and not st.has_exited


# --- one forest -----------------------------------------------------------------------------


#: the caller's process group when it starts the forest and runs clear (the forest's roots inherit it):
#: a group led outside the namespace (pgid reads 0), its own group, its own session, or a group whose
#: leader has exited (``python caller.py & exit`` in a script)
CONTEXTS = ("outside", "own_group", "own_session", "dead_leader")


def enter_context(context: str) -> None:
    if context == "own_group":
        os.setpgid(0, 0)
    elif context == "own_session":
        os.setsid()
    elif context == "dead_leader":
        leader = os.fork()
        if leader == 0:
            try:
                os.setpgid(0, 0)
                while True:
                    signal.pause()
            finally:
                os._exit(0)
        os.setpgid(leader, leader)  # both sides: no race with the child's own call
        os.setpgid(0, leader)
        os.kill(leader, signal.SIGKILL)
        os.waitpid(leader, 0)


class ForestRun:
    context = "outside"

    def __init__(self, forest: Forest, base: Path, other: dict[str, Any] | None, cli: bool,
                 programs: dict[str, str] | None = None) -> None:
        self.forest = forest
        self.dir = base / f"forest-{forest.seed}"
        self.other = other
        self.cli = cli
        self.rng = random.Random(forest.seed * 7919 + 1)  # selections: their own stream
        self.base = base
        self.programs = programs or {}
        self.report_r = self.report_w = -1  # the report pipe: made in run(), in the process that runs it
        self.reaped: dict[int, int] = {}  # pid -> wait status, from whoever reaped it
        self.reap_log_at = 0  # where this forest's part of the init's log starts
        self.driver_children: list[int] = []
        self.pids: dict[str, int] = {}  # node id -> pid
        self.forked: list[dict[str, int]] = []  # helpers forked on SIGTERM: {pid, ppid}
        self.extra: list[tuple[int, int]] = []  # processes the fuzzer made besides nodes (bystander)
        self.record: dict[str, Any] = {"seed": forest.seed, "cli": cli, "violations": [], "notes": []}
        self.buf = b""  # report lines not read yet

    # setup ---------------------------------------------------------------------------------
    def setup(self) -> None:
        self.dir.mkdir(mode=0o755)
        self.sim = SimHost.init(self.dir / "sim", gpus=GPUS, memory=96 * GiB, release_delay=0.02)
        for d in (self.sim.root, self.sim.alloc):
            d.chmod(0o1777)  # the second user's holders write their records there
        self.state = self.dir / "state"
        self.state.mkdir(mode=0o700)
        self.canary = self.dir / "canary"
        self.canary.mkdir()
        (self.canary / "file").write_text("canary\n")
        self.runfile = self.dir / "run.json"
        run = {"forest": self.forest.to_json(), "sim": str(self.sim.root), "runfile": str(self.runfile),
               "other": self.other or {}, "python": sys.executable, "python_other": PYTHON_OTHER,
               "python_home": sys.base_prefix,
               "python_home_other": "/usr" if PYTHON_OTHER == "/usr/bin/python3" else sys.base_prefix,
               "programs": self.programs, "preload": system_library()}
        self.runfile.write_text(json.dumps(run))
        self.runfile.chmod(0o644)
        self.run_doc = run

    def launch(self) -> None:
        spawner = Node(self.run_doc, self.report_w)
        for rid in self.forest.roots:
            spawner.spawn(self.run_doc["forest"]["nodes"][rid])
        self.driver_children = list(spawner.children)
        want = set(self.forest.nodes)
        deadline = time.monotonic() + 30  # nodes start in milliseconds; 30 s is a loaded machine
        while want - set(self.pids):
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"nodes never reported ready: {sorted(want - set(self.pids))}")
            ready, _, _ = select.select([self.report_r], [], [], left)
            if ready:
                self.buf += os.read(self.report_r, 65536)
                *lines, self.buf = self.buf.split(b"\n")
                for line in lines:
                    doc = json.loads(line)
                    if doc["event"] == "ready":
                        self.pids[doc["id"]] = doc["pid"]
                    elif doc["event"] == "failed":
                        raise RuntimeError(f"node {doc['id']} failed to start: {doc['error']}")
                    else:
                        self.take_report(doc)
            self.reap_mine()
        # leaders that exit: wait until they are gone (reaped), so the plan sees a settled forest
        exiting = [self.pids[n] for n, s in self.forest.nodes.items() if s.exits]
        until(lambda: all((st := read_stat(p)) is None or st.has_exited for p in exiting) or self.reap_mine(), 10,
              "leaders to exit")  # a zombie (its parent stopped) has exited too
        # main threads that exit while a second thread keeps the process: gone before the plan, and before
        # a stop (a stopped main thread would exit only once continued)
        ending = [self.pids[n] for n, s in self.forest.nodes.items() if s.main_exits]
        until(lambda: all((st := read_stat(p)) is None or st.has_exited or st.leader_exited for p in ending), 10,
              "main threads to exit")
        stopping = [self.pids[n] for n, s in self.forest.nodes.items() if s.stopped]
        for pid in stopping:  # after the exits: a group orphaned with a stopped member gets SIGHUP then
            st = read_stat(pid)
            if st is not None and not st.has_exited:
                send_signal(st.ident, signal.SIGSTOP)
        until(lambda: all((st := read_stat(p)) is None or st.state in "TtZ" for p in stopping), 10, "nodes to stop")

    def reap_mine(self) -> bool:
        for pid in list(self.driver_children):
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done, status = pid, None
            if done:
                self.driver_children.remove(pid)
                if status is not None:
                    self.reaped[pid] = status
        return False

    def take_report(self, doc: dict[str, Any]) -> None:
        if doc["event"] == "forked":
            self.forked.append({"pid": doc["pid"], "ppid": doc["ppid"]})
        elif doc["event"] == "reaped":
            self.reaped[doc["pid"]] = doc["status"]

    def read_reaped_log(self) -> None:
        """What the namespace's init reaped since this forest began."""
        try:
            with open(self.base / REAPED_LOG, "rb") as f:
                f.seek(self.reap_log_at)
                text = f.read().decode()
        except OSError:
            return
        for line in text.splitlines():
            pid, _, status = line.partition(" ")
            if pid.isdigit() and status.isdigit():
                self.reaped[int(pid)] = int(status)

    def read_reports(self) -> None:
        os.set_blocking(self.report_r, False)
        try:
            while True:
                chunk = os.read(self.report_r, 65536)
                if not chunk:
                    break
                self.buf += chunk
        except BlockingIOError:
            pass
        *lines, self.buf = self.buf.split(b"\n")
        for line in lines:
            self.take_report(json.loads(line))

    def facts(self) -> dict[str, dict[str, Any]]:
        """Every process of the forest, nodes and wrappers (``runuser``, ``su``, ``unshare``), keyed by a label."""
        out: dict[str, dict[str, Any]] = {}
        for nid, spec in self.forest.nodes.items():
            if spec.exits:
                continue
            f = proc_facts(self.pids[nid])
            if f is None:
                continue
            f.update(node=nid, kind="node", spec=_spec_summary(spec), holds=[list(h) for h in spec.hold],
                     handles=spec.handles, title=spec.display_title, term=spec.term.value,
                     children=spec.children, wrapped=None, program=spec.program, mps_gpus=spec.mps_gpus,
                     hostile=spec.hostile,
                     parent_program=self.forest.nodes[spec.parent].program if spec.parent else None)
            out[nid] = f
            if spec.wrapper:
                w = proc_facts(f["ppid"])
                if w is not None and w["name"] == spec.wrapper:
                    w.update(node=nid + "^", kind="wrapper", spec=spec.wrapper, holds=[], handles=[],
                             title=spec.wrapper, term="wait" if spec.wrapper == "unshare" else "forward",
                             children=[nid], wrapped=nid)
                    out[nid + "^"] = w
        return out

    # selection -----------------------------------------------------------------------------
    def selection(self, facts: dict[str, dict[str, Any]]) -> dict[str, Any]:
        rng = self.rng
        sel: dict[str, Any] = {"gpus": None, "pids": [], "user": None, "match": None, "all_users": rng.random() < 0.35,
                               "include_handles": rng.random() < 0.25, "holders_only": rng.random() < 0.2}
        if rng.random() < 0.4:
            sel["gpus"] = sorted(rng.sample(range(GPUS), rng.randint(1, GPUS - 1)))
        labels = sorted(lab for lab, f in facts.items() if f["kind"] != "caller")
        r = rng.random()
        if r < 0.3 and labels:
            sel["pids"] = sorted({facts[lab]["pid"] for lab in rng.sample(labels, min(len(labels), rng.randint(1, 2)))})
        elif r < 0.42 and self.other:
            sel["user"] = rng.choice(["root", self.other["name"]])
        elif r < 0.55 and labels:
            picks = rng.sample(labels, min(len(labels), rng.randint(1, 2)))
            sel["match"] = "|".join(re.escape(facts[lab]["title"]) for lab in picks)
        return sel

    # the clear -----------------------------------------------------------------------------
    def clear(self, sel: dict[str, Any], dry: bool, reuse: bool) -> dict[str, Any]:
        """{"doc": clear document or None, "error": one line, "exit": code (CLI), "crash": text or None}."""
        os.environ["GPUSLATE_STATE_DIR"] = str(self.state)
        if self.cli:
            return self._clear_cli(sel, dry)
        confirm = self._reuse_pid if reuse else None
        try:
            res = gpuslate.clear(sel["gpus"], pids=sel["pids"], user=sel["user"], match=sel["match"],
                                 all_users=sel["all_users"], include_handles=sel["include_handles"],
                                 holders_only=sel["holders_only"], grace=GRACE, timeout=TIMEOUT, dry_run=dry,
                                 sim=str(self.sim.root), confirm=confirm)
        except GpuslateError as exc:
            return {"doc": None, "error": f"{type(exc).__name__}: {exc}", "exit": None, "crash": None}
        except Exception:
            return {"doc": None, "error": None, "exit": None, "crash": traceback.format_exc(limit=6)}
        return {"doc": res.to_json(), "error": None, "exit": None, "crash": None}

    def _clear_cli(self, sel: dict[str, Any], dry: bool) -> dict[str, Any]:
        args = [sys.executable, "-m", "gpuslate", "--sim", str(self.sim.root), "clear", "--json",
                "--grace", str(GRACE), "--timeout", str(TIMEOUT), "--dry-run" if dry else "--yes"]
        if sel["gpus"] is not None:
            args += ["--gpus", ",".join(map(str, sel["gpus"]))]
        for pid in sel["pids"]:
            args += ["--pid", str(pid)]
        for flag in ("user", "match"):
            if sel[flag] is not None:
                args += [f"--{flag}", sel[flag]]
        for flag in ("all_users", "include_handles", "holders_only"):
            if sel[flag]:
                args.append("--" + flag.replace("_", "-"))
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"))
        p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=60)
        crash = p.stderr if "Traceback" in p.stderr else None
        doc = None
        try:
            doc = json.loads(p.stdout)
        except ValueError:
            if not crash and p.returncode not in (2, 3, 5):
                crash = f"exit {p.returncode}, stdout not JSON: {p.stdout[:300]!r} stderr {p.stderr[-300:]!r}"
        if doc is not None and doc.get("schema") == "gpuslate.error.v1":
            return {"doc": None, "error": doc["error"]["message"], "exit": p.returncode, "crash": crash}
        return {"doc": doc, "error": None if doc else p.stderr.strip()[-300:], "exit": p.returncode, "crash": crash}

    def _reuse_pid(self, plan: Any) -> bool:
        """Between plan and act: a planned target exits and a bystander takes its pid."""
        mine = {f["pid"]: f for f in self.before.values()}
        if any(f["state"] in "Tt" for f in mine.values()):
            return True  # a death of ours could orphan a stopped group: the kernel's SIGHUP is not gpuslate's
        cands = []
        for t in plan.targets:
            d = t.to_json()
            f = mine.get(d["pid"])
            if f is None or f["ticks"] != d["start_ticks"] or f["kind"] != "node" or "\t" in f["nspid"]:
                continue
            parent = mine.get(f["ppid"])
            if any(g["ppid"] == f["pid"] for g in mine.values()) or f["pid"] == f["sid"] \
                    or (parent is not None and (parent["kind"] == "wrapper" or parent["leader_exited"])):
                # only a leaf whose death ends nothing else: no children, no session, no runuser above; and
                # whose pid comes free (a parent whose main thread exited runs no SIGCHLD handler: never reaped)
                continue
            cands.append(f)
        if not cands:
            return True
        victim = self.rng.choice(sorted(cands, key=lambda f: f["pid"]))
        send_signal(ProcessId(victim["pid"], victim["ticks"]), signal.SIGKILL)
        until(lambda: read_stat(victim["pid"]) is None or self.reap_mine(), 5, "the victim to be reaped")
        self.killed.append((victim["pid"], victim["ticks"]))
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(victim["pid"] - 1))
        pid = os.fork()
        if pid == 0:
            try:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                if self.other and self.rng.random() < 0.5:
                    os.setgroups([])
                    os.setgid(self.other["gid"])
                    os.setuid(self.other["uid"])
                os.setsid()
                while True:
                    signal.pause()
            finally:
                os._exit(1)
        self.driver_children.append(pid)
        st = read_stat(pid)
        if st is not None:
            self.extra.append((pid, st.start_ticks))
        self.record["reuse"] = {"victim": victim["node"], "pid": victim["pid"], "bystander": pid,
                                "reused": pid == victim["pid"]}
        return True

    # the whole run -------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        t0 = time.monotonic()
        self.report_r, self.report_w = os.pipe()
        try:
            self.reap_log_at = os.stat(self.base / REAPED_LOG).st_size
        except OSError:
            self.reap_log_at = 0
        self.setup()
        self.killed: list[tuple[int, int]] = []
        self.record["context"] = self.context
        try:
            enter_context(self.context)
            unit = UnitPhase(self) if random.Random(self.forest.seed * 6007 + 32).random() < UNIT_SHARE else None
            if unit is not None:
                unit.up()  # the forest's programs then start during the unit's life
            self.launch()
            if unit is not None:
                self.record["unit"] = unit.down()
                self.record["violations"] += self.record["unit"].pop("violations")
            self.before = self.facts()
            me = proc_facts(os.getpid())
            assert me is not None
            me.update(node="caller", kind="caller", spec=f"the caller ({self.context})", holds=[], handles=[],
                      title="caller", term="default", children=[], wrapped=None)
            self.before["caller"] = me
            sel = self.selection(self.before)
            self.record["selection"] = sel
            outside = checks.tree_state(self.dir, skip=(self.sim.root, self.state))
            dry = self.clear(sel, True, False)
            act = self.clear(sel, False, not self.cli and self.rng.random() < 0.2)
            # deaths the act caused (a forwarded SIGTERM) take a moment to show: look for one, briefly
            doc = act.get("doc") or {"targets": []}
            planned = {(t["pid"], t["start_ticks"]) for t in doc["targets"]} | set(self.killed)
            bystanders = [(f["pid"], f["ticks"]) for f in self.before.values()
                          if (f["pid"], f["ticks"]) not in planned and alive((f["pid"], f["ticks"]))]
            until(lambda: not all(alive(i) for i in bystanders), SETTLE_S, None)
            self.read_reports()
            after = {lab: alive((f["pid"], f["ticks"])) for lab, f in self.before.items()}
            self.read_reaped_log()
            extra_after = {pid: alive((pid, t)) for pid, t in self.extra}
            audit = checks.read_audit(self.state / "audit.jsonl")
            self.record["violations"] = checks.check_all(checks.Observed(
                before=self.before, after=after, selection=sel, dry=dry, act=act, audit=audit,
                forked=self.forked, killed=self.killed, extra_after=extra_after, reaped=self.reaped,
                outside_before=outside, outside_after=checks.tree_state(self.dir, skip=(self.sim.root, self.state)),
                stray_audit=[str(p) for p in self.dir.rglob("audit.jsonl")
                             if p.parent not in (self.state, self.dir / "unit-state")],
                caller=os.getpid(), cli=self.cli,
                user_uids={"root": 0, **({self.other["name"]: self.other["uid"]} if self.other else {})}))
            self.record["plan"] = _plan_summary(dry, act)
            self.record["description"] = describe(self.forest, self.before, act.get("doc"))
        except Exception:
            self.record["violations"].append({"cls": "fuzzer-error", "msg": traceback.format_exc(limit=8)})
        finally:
            self.kill_all()
        self.record["elapsed_s"] = round(time.monotonic() - t0, 3)
        return self.record

    def kill_all(self) -> None:
        try:
            self._kill_all()
        except Exception:
            self.record["violations"].append({"cls": "fuzzer-error", "msg": traceback.format_exc(limit=8)})

    def _kill_all(self) -> None:
        self.read_reports()
        idents = []
        wrappers = [f["pid"] for f in getattr(self, "before", {}).values() if f["kind"] == "wrapper"]
        for pid in [*self.pids.values(), *(f["pid"] for f in self.forked), *(p for p, _ in self.extra),
                    *wrappers, *self.driver_children]:
            st = read_stat(pid)
            if st is not None:
                idents.append(st.ident)
        for ident in idents:
            send_signal(ident, signal.SIGKILL)
        until(lambda: not any(alive(i) for i in idents) or self.reap_mine(), 5, "the forest to die")
        until(lambda: not self.reap_mine() and not self.driver_children, 5, "the caller's children")
        os.close(self.report_r)
        os.close(self.report_w)
        shutil.rmtree(self.dir, ignore_errors=True)


#: the share of forests that first start a unit, its programs then being "unrelated programs of the unit's
#: user started during its life" (issue 32); its down is checked before the clear
UNIT_SHARE = 0.08
#: how the unit's workers rename themselves (tests/units/escapees.py): kept (SPT_NOENV: the marker stays),
#: clobber (the title over the environment before any scan: nothing proves it the unit's), late (stays in the
#: unit's session, recorded at readiness, then calls setsid and wipes its environment: proven by its identity)
UNIT_WORKERS = {"kept": "setproctitle", "clobber": "setproctitle-clobber", "late": "wipe-late"}


class UnitPhase:
    """A unit started before the forest (the forest's nodes are then programs of the unit's user that
    started during its life, holding GPUs of their own or the unit's), ended with ``down --clear``.

    Checked: ``down`` signals only the unit's own processes (its main process and its workers: never a
    forest node, never the worker nothing proves the unit's), no forest node dies, every worker proven
    the unit's (its marker, its recorded identity) is gone, and ``released`` is said only when nothing
    holds the unit's GPU any more."""

    def __init__(self, run: ForestRun) -> None:
        self.run = run
        self.rng = random.Random(run.forest.seed * 6007 + 33)
        self.out = run.dir / "unit"
        self.state = run.dir / "unit-state"
        self.gpu = self.rng.randrange(GPUS)
        self.workers = {name: self.rng.randrange(GPUS) for name in UNIT_WORKERS if self.rng.random() < 0.7}
        self.violations: list[dict[str, str]] = []

    def host(self) -> Any:
        return gpuslate.Host.open(sim=str(self.run.sim.root))

    def up(self) -> None:
        sys.path.append(str(Path(__file__).resolve().parents[1] / "units"))
        import escapees  # tests/units: the workers that rename themselves
        from gpuslate.units.spec import UnitSpec

        self.out.mkdir()
        self.state.mkdir(mode=0o700)
        os.environ["GPUSLATE_STATE_DIR"] = str(self.state)
        cmd = escapees.command(self.out, self.run.sim.root,
                               *[(n, UNIT_WORKERS[n], g, None) for n, g in self.workers.items()])
        with self.host() as host:
            res = host.up(UnitSpec("fz", command=cmd, gpus=[self.gpu], ready_log="serving", containment="session",
                                   start_timeout=30, grace=0.2, stop_timeout=5))
        if not res.ok:
            raise RuntimeError(f"the unit did not start: {res.record.failure}")
        self.main = (res.record.pid, res.record.start_ticks)
        self.pids = escapees.ready_pids(self.out)
        if "late" in self.pids:
            escapees.escape_now(self.out, "late")
        self.idents = {n: (pid, st.start_ticks) for n, pid in self.pids.items() if (st := read_stat(pid))}

    def down(self) -> dict[str, Any]:
        from gpuslate.units import DownOptions
        from gpuslate.units.stop import Verification

        nodes = {nid: (pid, st.start_ticks) for nid, pid in self.run.pids.items()
                 if (st := read_stat(pid)) is not None and not st.has_exited}
        with self.host() as host:
            res = host.down("fz", DownOptions(clear_strays=True, grace=0.2, timeout=2))
        mine = {self.main[0], *self.pids.values()}
        for e in checks.read_audit(self.state / "audit.jsonl"):
            t = e["target"]
            if t.get("pid") not in mine or (t.get("pid") == self.pids.get("clobber")):
                self.violations.append(checks.V("unit-signaled-unproven", f"down signaled {t.get('pid')} "
                                                f"({t.get('command')}): not a process the unit's ties prove"))
        until(lambda: all(not alive(i) for n, i in self.idents.items() if n != "clobber"), 2, None)
        for nid, ident in nodes.items():
            if not alive(ident):
                self.violations.append(checks.V("unit-collateral", f"forest node {nid} pid {ident[0]} died in down"))
        for n, ident in self.idents.items():
            if n != "clobber" and alive(ident):
                self.violations.append(checks.V("unit-proven-left", f"the unit's worker {n} pid {ident[0]}, proven "
                                                                    "its own, outlived down"))
        if res.report.verification == Verification.RELEASED:
            held = [h.record.pid for h in self.run.sim.held() if h.record.gpu == self.gpu]
            if held:
                self.violations.append(checks.V("unit-released-but-held", f"down said released, yet GPU {self.gpu} "
                                                                          f"is held by {held}"))
        for ident in self.idents.values():  # what down rightly left (the unproven worker): ours to end
            send_signal(ProcessId(*ident), signal.SIGKILL)
        # gone, and their memory released, before the forest's clear plans: they are no part of it
        unit = {i[0] for i in self.idents.values()} | {self.main[0]}
        until(lambda: not any(alive(i) for i in self.idents.values())
              and not any(h.record.pid in unit for h in self.run.sim.held()), 10, "the unit's workers to end")
        os.environ["GPUSLATE_STATE_DIR"] = str(self.run.state)
        return {"gpu": self.gpu, "workers": self.workers, "verification": res.report.verification.value,
                "strays": [s.pid for s in res.strays], "violations": self.violations}


def until(cond: Any, timeout: float, what: str | None) -> None:
    """Await ``cond`` (polled every ms); ``what`` None: a bounded observation window, not an error."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            if what is None:
                return
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.001)


def _spec_summary(s: NodeSpec) -> str:
    parts = [s.start.value, s.group.value, f"term={s.term.value}"]
    if s.hold:
        parts.append("mem " + ",".join(f"{g}:{b // 1024**2}M" for g, b in s.hold))
    if s.handles:
        parts.append("handles " + ",".join(map(str, s.handles)))
    if s.exits:
        parts.append("exits")
    if s.stopped:
        parts.append("stopped")
    if s.tty:
        parts.append("leads a terminal")
    if s.program:
        parts.append(f"is {s.program}" + (f" (a look-alike: {s.hostile})" if s.hostile else ""))
    if s.mps_gpus:
        parts.append("MPS client on " + ",".join(map(str, s.mps_gpus)))
    elif s.rename != Rename.SPT:
        parts.append(f"renamed by {s.rename.value}")
    if s.main_exits:
        parts.append("main thread exits")
    if s.delay_ms:
        parts.append(f"starts {s.delay_ms} ms late")
    return " ".join(parts)


def _plan_summary(dry: dict[str, Any], act: dict[str, Any]) -> dict[str, Any]:
    def one(r: dict[str, Any]) -> Any:
        d = r.get("doc")
        if d is None:
            return {"error": r.get("error"), "exit": r.get("exit")}
        return {"status": d["status"], "gpus": d["gpus"],
                "targets": [[t["pid"], t["role"], (t.get("ended_by") or ""), t.get("job"), t.get("reason"),
                             t.get("refused")] for t in d["targets"]],
                "spared": [[s["pid"], s["reason"]] for s in d["spared"]]}
    return {"dry": one(dry), "act": one(act)}


def describe(forest: Forest, facts: dict[str, dict[str, Any]], doc: dict[str, Any] | None) -> str:
    """The forest as a tree: pid, ppid, pgid, sid, uid, name, what it is, namespace, the act's verdict."""
    verdict: dict[int, str] = {}
    for t in (doc or {}).get("targets", []):
        verdict[t["pid"]] = f"TARGET {t['role']}"
    for s in (doc or {}).get("spared", []):
        verdict[s["pid"]] = f"spared: {s['reason']}"
    by_pid = {f["pid"]: lab for lab, f in facts.items()}
    kids: dict[str | None, list[str]] = {}
    for lab, f in sorted(facts.items(), key=lambda kv: kv[1]["pid"]):
        parent = by_pid.get(f["ppid"])
        kids.setdefault(parent, []).append(lab)
    lines: list[str] = []

    def walk(lab: str, depth: int) -> None:
        f = facts[lab]
        lines.append(f"{'  ' * depth}{lab} pid={f['pid']} ppid={f['ppid']} pgid={f['pgid']} sid={f['sid']} "
                     f"uid={f['uid']} name={f['name']!r} [{f['spec']}] ns={f['ns'][5:-1]} nspid={f['nspid']!r}"
                     f" -> {verdict.get(f['pid'], 'not in the plan')}")
        for c in kids.get(lab, []):
            walk(c, depth + 1)

    for lab in kids.get(None, []):
        walk(lab, 0)
    return "\n".join(lines)


# --- entry points ---------------------------------------------------------------------------


def sweep() -> None:
    """End whatever a forest left (every process here is the fuzzer's): all but init, the
    placeholder and the driver; a forest never meets the previous one's processes."""
    keep = {1, os.getpid(), *([] if os.getpid() == 2 else [2])}
    idents = [st.ident for st in (read_stat(p) for p in list_pids() if p not in keep)
              if st is not None and not st.has_exited]
    for ident in idents:
        send_signal(ident, signal.SIGKILL)
    until(lambda: not any(alive((i.pid, i.start_ticks)) for i in idents), 10, "the sweep")


def in_caller(run: ForestRun) -> dict[str, Any]:
    """Run the forest in a forked caller process (a fresh pid, group and session each time);
    its record comes back through a pipe. A caller that dies without one was killed by the act."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            run.context = random.Random(run.forest.seed * 31 + 7).choice(CONTEXTS)
            data = json.dumps(run.run()).encode()
            while data:
                data = data[os.write(w, data):]
        finally:
            os._exit(0)
    os.close(w)
    chunks = []
    deadline = time.monotonic() + CALLER_TIMEOUT_S
    while (left := deadline - time.monotonic()) > 0 and select.select([r], [], [], left)[0]:
        chunk = os.read(r, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    else:
        os.kill(pid, signal.SIGKILL)  # hung: its record is lost, the seed replays it
        chunks = [json.dumps({"seed": run.forest.seed, "cli": run.cli, "notes": [], "violations": [
            {"cls": "fuzzer-error", "msg": f"the caller did not finish within {CALLER_TIMEOUT_S} s"}]}).encode()]
    os.close(r)
    _, status = os.waitpid(pid, 0)
    if chunks:
        return json.loads(b"".join(chunks))
    return {"seed": run.forest.seed, "cli": run.cli, "notes": [],
            "violations": [{"cls": "protected-signaled",
                            "msg": f"the caller died ({os.waitstatus_to_exitcode(status)}) during the run"}]}



def init(argv: list[str]) -> NoReturn:
    """PID 1 of the namespace: fork the driver, reap everything, exit with the driver's status.

    Unless ``--driver-pid2``, a placeholder takes PID 2 first, so the driver and its children are
    not where a container's entry point (PID 2, under tini) would be."""
    if "--driver-pid2" not in argv and os.fork() == 0:
        while True:
            signal.pause()
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--out", type=Path, required=True)
    log = ap.parse_known_args(argv)[0].out / REAPED_LOG
    driver = os.fork()
    if driver == 0:
        try:
            os._exit(main(argv))
        except BaseException:
            traceback.print_exc()
            os._exit(3)
    while True:
        pid, status = os.wait()
        if pid == driver:
            os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
        with open(log, "a") as f:  # one short line, appended: the driver reads it while this writes
            f.write(f"{pid} {status}\n")


def _setup_failed(rec: dict[str, Any]) -> bool:
    """The forest itself never came up (the harness's failure, not gpuslate's): nothing was planned."""
    v = rec.get("violations") or []
    return bool(v) and all(x.get("cls") == "fuzzer-error" and "never reported ready" in x.get("msg", "") for x in v)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--forests", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--other", help="NAME:UID:GID of the second user")
    ap.add_argument("--cli-every", type=int, default=20, help="every Nth forest goes through the CLI")
    ap.add_argument("--driver-pid2", action="store_true", help="the driver is PID 2, like a container's entry point")
    args = ap.parse_args(argv)
    other = None
    if args.other:
        name, uid, gid = args.other.split(":")
        other = {"name": name, "uid": int(uid), "gid": int(gid)}
    os.environ.pop("GPUSLATE_SIM", None)
    os.environ.pop("GPUSLATE_LOCK_DIR", None)
    programs = {name: program_named(name, args.out / PROGRAMS) for name in (MPS_CONTROL, MPS_SERVER)}
    with open(args.out / "results.jsonl", "w") as out:
        for i in range(args.forests):
            seed = args.seed + i
            forest = generate(seed, other_user=other is not None)
            for _attempt in range(2):  # a forest whose nodes could not start (a loaded machine) runs again once
                run = ForestRun(forest, args.out, other, cli=args.cli_every > 0 and seed % args.cli_every == 0,
                                programs=programs)
                rec = run.run() if args.driver_pid2 else in_caller(run)
                sweep()
                shutil.rmtree(run.dir, ignore_errors=True)  # the caller's, if the act or a hang ended it first
                if not _setup_failed(rec):
                    break
            out.write(json.dumps(rec) + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    if os.getpid() == 1:
        init(sys.argv[1:])
    sys.exit(main(sys.argv[1:]))
