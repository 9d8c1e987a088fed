"""The invariants of ``clear`` (docs/clear.md, issue 15), as pure functions of observed facts.

Each violation is ``{"cls": CLASS, "msg": ...}``; the classes:

* ``signaled-not-planned`` — act = plan: an audited signal went to a process that is not a target of
  the act's plan, nor forked while stopping by a target (``forked-unknown-parent``);
* ``dry-run-differs`` — the dry run and the act planned different targets for the same forest;
* ``protected-signaled`` — a signal to the caller, its ancestors or the namespace's init;
* ``collateral`` — a process that was not a target (spared, protected, not selected, another
  user's, a bystander on a reused pid) is dead after the act;
* ``held-without-reason`` — a holder on a verified GPU is alive after the act, and neither spared
  with a reason, nor a target the result reports as not ended, nor in the diagnosis;
* ``clean-but-held`` / ``empty-success`` — success claimed without evidence (a spared MPS server's
  memory is the host's only for a genuine server, one the forest started under its control daemon
  with nothing preloaded, and only while the genuine servers of a GPU hold at most
  :data:`gpuslate.host.daemons.BASELINE_CAP` there together: a look-alike's memory, or memory
  beyond the cap, is never called free);
* ``mps-server-under-client`` — an MPS server (the program, genuine or not) was signaled while a
  live MPS client that could be its client (same user, a GPU in common: the forest's clients use
  the default pipe folder, or one their title wrote over) was not a target;
* ``wrote-outside`` — files changed outside the state folder and the simulated host;
* ``unlisted`` — a process the plan considered (a target's descendant, a member of a launcher's
  group, a holder of a selected GPU) is neither a target nor spared with a reason;
* ``name-protected`` — a process spared for a name it gave itself (``sshd``, ``bash``...);
* ``target-unrelated`` — a target that is in the job of no holder the selection can select (jobs
  merged through a group id that means nothing, such as 0);
* ``plan-contract`` — a process both target and spared, twice in a list, or spared without reason;
* ``crash`` — a traceback or an undocumented exit.
"""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuslate.host.daemons import BASELINE_CAP

from .forest import MPS_CONTROL, MPS_SERVER

#: exit codes documented for clear (src/gpuslate/cli/exits.py)
DOCUMENTED_EXITS = {0, 2, 3, 4, 5, 6, 7, 130}
#: reasons that come from a name a process chose, never from a kernel fact about one of ours
NAME_REASONS = ("infrastructure", "interactive shell", "kernel thread", "multiplexer", "PID 1")
#: one of them as words ("PID 1" is not "PID 1554", which an MPS server's reason names as its client)
_NAME_REASON = re.compile(r"\b(?:" + "|".join(re.escape(r) for r in NAME_REASONS) + r")\b")


@dataclass
class Observed:
    before: dict[str, dict[str, Any]]  # label -> facts at plan time (see driver.proc_facts)
    after: dict[str, bool]  # label -> alive after the act
    selection: dict[str, Any]
    dry: dict[str, Any]
    act: dict[str, Any]
    audit: list[dict[str, Any]]  # signal entries, each with its outcome
    forked: list[dict[str, int]]  # helpers our nodes forked on SIGTERM: {pid, ppid}
    killed: list[tuple[int, int]]  # targets the fuzzer itself killed between plan and act
    extra_after: dict[int, bool]  # bystanders (reused pids): alive after the act
    outside_before: dict[str, float]
    outside_after: dict[str, float]
    stray_audit: list[str]
    caller: int
    cli: bool
    user_uids: dict[str, int]  # --user NAME -> uid
    reaped: dict[int, int] = field(default_factory=dict)  # pid -> wait status, from whoever reaped it


def V(cls: str, msg: str) -> dict[str, str]:
    return {"cls": cls, "msg": msg}


def read_audit(path: Path) -> list[dict[str, Any]]:
    """Signal entries of the audit log, each with ``outcome`` (None: none recorded)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    signals: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("event") == "signal":
            signals[e["id"]] = {**e, "outcome": None}
        elif e.get("event") == "outcome" and e.get("id") in signals:
            signals[e["id"]]["outcome"] = e.get("outcome")
    return list(signals.values())


def tree_state(root: Path, skip: Iterable[Path]) -> dict[str, float]:
    """Every path under ``root`` outside ``skip``, with its mtime (what may not change)."""
    skipped = {str(p) for p in skip}
    out: dict[str, float] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if os.path.join(dirpath, d) not in skipped]
        for name in filenames + dirnames:
            p = os.path.join(dirpath, name)
            try:
                out[p] = os.lstat(p).st_mtime
            except FileNotFoundError:
                pass
    return out


def check_all(o: Observed) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    for r, what in ((o.dry, "dry run"), (o.act, "act")):
        if r.get("crash"):
            out.append(V("crash", f"{what}: {r['crash'].strip()[-600:]}"))
        if r.get("exit") is not None and r["exit"] not in DOCUMENTED_EXITS:
            out.append(V("crash", f"{what}: undocumented exit {r['exit']}"))
    dry, act = o.dry.get("doc"), o.act.get("doc")
    if (dry is None) != (act is None):
        out.append(V("dry-run-differs", f"dry run {'failed: ' + str(o.dry.get('error')) if dry is None else 'ran'}, "
                                         f"act {'failed: ' + str(o.act.get('error')) if act is None else 'ran'}"))
    out += check_contract(dry, "dry run") + check_contract(act, "act")
    if dry is not None and act is not None:
        out += check_same_plan(dry, act)
    if act is not None:
        out += check_act_is_plan(o, act) + check_collateral(o, act) + check_holders(o, act)
        out += check_listed(o, act) + check_names(o, act) + check_related(o, act)
    elif o.audit:
        out.append(V("signaled-not-planned", f"the act failed ({o.act.get('error')}) but signals were audited"))
    out += check_refusal(o) + check_mps(o, act)
    if o.outside_before != o.outside_after:
        changed = sorted(set(o.outside_before.items()) ^ set(o.outside_after.items()))
        out.append(V("wrote-outside", f"changed outside the state and sim folders: {changed[:5]}"))
    if o.stray_audit:
        out.append(V("wrote-outside", f"an audit log outside the state folder: {o.stray_audit}"))
    return out


def check_mps(o: Observed, act: dict[str, Any] | None) -> list[dict[str, str]]:
    """An MPS server is signaled only when every live client that could be its own is a target."""
    targets = {t["pid"] for t in (act or {}).get("targets", [])}
    signaled = {e["target"]["pid"] for e in o.audit if e["outcome"] != "refused"}
    out = []
    for f in o.before.values():
        if f.get("program") != MPS_SERVER or f["pid"] not in signaled:
            continue
        mine = {g for g, _ in f["holds"]}
        for lab, c in o.before.items():
            if c.get("mps_gpus") and set(c["mps_gpus"]) & mine and c["uid"] == f["uid"] and c["pid"] not in targets \
                    and c["state"] not in "ZX":
                out.append(V("mps-server-under-client", f"MPS server {f['pid']} ({f['spec']}) signaled while {lab} "
                                                        f"pid {c['pid']}, a client of GPUs {sorted(mine)}, was not "
                                                        "a target"))
    return out


def check_contract(doc: dict[str, Any] | None, what: str) -> list[dict[str, str]]:
    if doc is None:
        return []
    out = []
    targets = [t["pid"] for t in doc["targets"]]
    spared = [s["pid"] for s in doc["spared"]]
    if len(targets) != len(set(targets)) or len(spared) != len(set(spared)):
        out.append(V("plan-contract", f"{what}: a pid listed twice: targets {targets}, spared {spared}"))
    if set(targets) & set(spared):
        out.append(V("plan-contract", f"{what}: both target and spared: {sorted(set(targets) & set(spared))}"))
    for s in doc["spared"]:
        if not (s.get("reason") or "").strip():
            out.append(V("plan-contract", f"{what}: {s['pid']} spared without a reason"))
    return out


def _planned(doc: dict[str, Any]) -> set[tuple[int, int]]:
    return {(t["pid"], t["start_ticks"]) for t in doc["targets"] if t["role"] != "forked while stopping"}


def check_same_plan(dry: dict[str, Any], act: dict[str, Any]) -> list[dict[str, str]]:
    a, b = _planned(dry), _planned(act)
    if a != b:
        return [V("dry-run-differs", f"dry run targets {sorted(a)} but act planned {sorted(b)}")]
    return []


def check_act_is_plan(o: Observed, act: dict[str, Any]) -> list[dict[str, str]]:
    out = []
    planned = _planned(act)
    target_pids = {p for p, _ in planned}
    forked_parent = {f["pid"]: f["ppid"] for f in o.forked}
    protected = {o.caller, 1}
    for e in o.audit:
        if e["outcome"] == "refused":
            continue  # the act-time gate wrote it down and did not send it
        t = e["target"]
        ident = (t["pid"], t["start_ticks"])
        if t["pid"] in protected:
            out.append(V("protected-signaled", f"{e['signal']} to {t['pid']} ({t.get('command')}): "
                                               f"the caller or the namespace's init"))
        if ident in planned:
            continue
        if t.get("role") == "forked while stopping":
            parent = forked_parent.get(t["pid"])
            if parent is None or parent not in target_pids:
                out.append(V("forked-unknown-parent", f"{e['signal']} to {t['pid']} ({t.get('command')}) as "
                                                      f"forked while stopping; its parent {parent} is not a target"))
            continue
        out.append(V("signaled-not-planned", f"{e['signal']} to {ident} ({t.get('command')}, role {t.get('role')}), "
                                             f"outcome {e['outcome']}: not a target of the plan"))
    return out


def _verdicts(doc: dict[str, Any]) -> tuple[dict[int, dict[str, Any]], dict[int, dict[str, Any]]]:
    return {t["pid"]: t for t in doc["targets"]}, {s["pid"]: s for s in doc["spared"]}


def check_collateral(o: Observed, act: dict[str, Any]) -> list[dict[str, str]]:
    out = []
    _, spared = _verdicts(act)
    planned = _planned(act)
    killed = set(o.killed)
    gone = planned | killed
    for lab, f in o.before.items():
        ident = (f["pid"], f["ticks"])
        if ident in gone or o.after[lab]:
            continue
        if f["kind"] == "wrapper" and not o.after.get(f["wrapped"], True):
            continue  # runuser / unshare end when the process they run ends
        verdict = spared[f["pid"]]["reason"] if f["pid"] in spared else "not in the plan"
        cause = _cause(o, f, gone)
        out.append(V("collateral", f"{lab} pid {f['pid']} ({f['title']}, uid {f['uid']}) died though not a target "
                                   f"[{verdict}]{death(o.reaped.get(f['pid']))}{cause}"))
    for pid, ok in o.extra_after.items():
        if not ok:
            out.append(V("collateral", f"bystander {pid} (forked onto a reused pid between plan and act) died"))
    return out


def death(status: int | None) -> str:
    """How a process ended, from its wait status: " (killed by SIGHUP)", " (exited 1)"; "" unknown."""
    if status is None:
        return ""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        hint = (": the kernel's, to an orphaned group with a stopped member or a hung-up terminal"
                if sig == signal.SIGHUP else "")
        return f" (killed by {name}{hint})"
    return f" (exited {os.waitstatus_to_exitcode(status)})"


def _cause(o: Observed, f: dict[str, Any], gone: set[tuple[int, int]]) -> str:
    """The likely way a target's death reached ``f``: its namespace's init, an ancestor that forwards."""
    by_pid = {g["pid"]: g for g in o.before.values()}
    ended: list[dict[str, Any]] = []
    cur = by_pid.get(f["ppid"])
    while cur is not None and cur not in ended:
        if (cur["pid"], cur["ticks"]) in gone:
            ended.append(cur)
        cur = by_pid.get(cur["ppid"])
    for a in ended:
        if a["ns"] == f["ns"] and a["nspid"].endswith("\t1"):
            return f"; its PID namespace's init {a['pid']} was a target"
    group = [g for g in o.before.values() if g["pgid"] == f["pgid"] and f["pgid"] > 0]
    if any(g["state"] in "Tt" for g in group):
        for g in o.before.values():
            if (g["pid"], g["ticks"]) in gone and any(m["ppid"] == g["pid"] for m in group):
                return (f"; its process group {f['pgid']} has stopped members and lost {g['pid']} ({g['title']}), "
                        "a parent of one of them: orphaned, it got the kernel's SIGHUP")
    for a in ended:
        if a["term"] == "forward":
            return f"; its ancestor {a['pid']} ({a['title']}) forwards SIGTERM and was a target"
    return f"; its ancestor {ended[0]['pid']} ({ended[0]['title']}) was a target" if ended else ""


def check_holders(o: Observed, act: dict[str, Any]) -> list[dict[str, str]]:
    out = []
    targets, spared = _verdicts(act)
    gpus = set(act["gpus"])
    diagnosed = {p["pid"] for d in act.get("diagnosis", []) for p in d.get("problems", [])}
    killed = {p for p, _ in o.killed}
    clean = act["status"] == "clean"
    genuine = {f["pid"] for lab, f in o.before.items()
               if f.get("program") == MPS_SERVER and not f.get("hostile") and f.get("parent_program") == MPS_CONTROL
               and f["pid"] not in targets and f["pid"] in spared and o.after[lab]}
    genuine_total: dict[int, int] = {}
    for f in o.before.values():
        if f["pid"] in genuine:
            for g, b in f["holds"]:
                genuine_total[g] = genuine_total.get(g, 0) + b
    for lab, f in o.before.items():
        held = {g for g, _ in f["holds"]} & gpus
        if not held or not o.after[lab] or f["pid"] in killed:
            continue
        t = targets.get(f["pid"])
        # a spared, genuine MPS server within the cap of its GPUs (issues 24, 32): the host's, free by definition
        baseline = f["pid"] in genuine and all(genuine_total[g] <= BASELINE_CAP for g, _ in f["holds"])
        if clean and (act["verify"] == "free" or t is not None) and not baseline:
            out.append(V("clean-but-held", f"status clean, verify {act['verify']}, yet {lab} pid {f['pid']} "
                                           f"({f['title']}) still holds GPU {sorted(held)}"))
        if f["pid"] in spared or f["pid"] in diagnosed or (t is not None and t.get("permission_denied")):
            continue
        if t is not None and not clean:
            continue  # a target not ended: the status says the run failed
        out.append(V("held-without-reason", f"{lab} pid {f['pid']} ({f['title']}) still holds GPU {sorted(held)} "
                                            f"after a {act['status']} run, neither spared nor diagnosed"))
    if clean and not act["gpus"] and not act["targets"]:
        out.append(V("empty-success", "status clean over an empty set of GPUs, nothing signaled"))
    return out


def check_listed(o: Observed, act: dict[str, Any]) -> list[dict[str, str]]:
    """Every process the plan considered is a target or spared with a reason."""
    targets, spared = _verdicts(act)
    listed = set(targets) | set(spared)
    by_pid = {f["pid"]: (lab, f) for lab, f in o.before.items()}
    sel = o.selection
    chosen = set(sel["gpus"]) if sel["gpus"] is not None else None
    considered: dict[int, str] = {}
    for f in o.before.values():
        holds = {g for g, _ in f["holds"]} | set(f["handles"])
        if holds and (chosen is None or holds & chosen):
            considered[f["pid"]] = "holds a selected GPU"
    for t in act["targets"]:
        if t["role"] == "forked while stopping" or t["pid"] not in by_pid:
            continue
        tf = by_pid[t["pid"]][1]
        root = t.get("job") == t["pid"]  # only a job's root brings its group along
        for f in o.before.values():
            if _descends(by_pid, f, t["pid"]):
                if not _through_protected(by_pid, f, t["pid"], spared):
                    considered.setdefault(f["pid"], f"a descendant of target {t['pid']}")
            elif not sel["holders_only"] and root and _known(tf) and tf["pgid"] == t["pid"] and f["pgid"] == t["pid"]:
                considered.setdefault(f["pid"], f"in the group that target {t['pid']} leads")
        # the climb to the job's root: ancestors in the target's (known) group, the caller's included
        cur = by_pid.get(tf["ppid"])
        while not sel["holders_only"] and _known(tf) and cur is not None and cur[1]["pgid"] == tf["pgid"]:
            considered.setdefault(cur[1]["pid"], f"an ancestor of target {t['pid']} in its group {tf['pgid']}")
            cur = by_pid.get(cur[1]["ppid"])
    out = []
    for pid, why in sorted(considered.items()):
        lab, f = by_pid[pid]
        if pid not in listed:
            out.append(V("unlisted", f"{lab} pid {pid} ({f['title']}) {why}, but the plan neither targets nor "
                                     "spares it"))
    return out


#: spared reasons that mean protected: descent never passes such a process (docs/clear.md, the job rule)
PROTECTED_REASONS = NAME_REASONS + ("gpuslate", "cannot be read")
_PROTECTED_REASON = re.compile(r"\b(?:" + "|".join(re.escape(r) for r in PROTECTED_REASONS) + r")\b")


def _through_protected(by_pid: dict[int, tuple[str, dict[str, Any]]], f: dict[str, Any], ancestor: int,
                       spared: dict[int, dict[str, Any]]) -> bool:
    """Whether the line from ``ancestor`` down to ``f`` passes a process spared as protected."""
    cur = by_pid.get(f["ppid"])
    while cur is not None and cur[1]["pid"] != ancestor:
        s = spared.get(cur[1]["pid"])
        if s is not None and _PROTECTED_REASON.search(s["reason"]):
            return True
        cur = by_pid.get(cur[1]["ppid"])
    return False


def _known(f: dict[str, Any]) -> bool:
    """A group is a fact only when its id and its session's mean something from here: inside a PID
    namespace whose group or session leader lives outside it, the kernel reports 0 (docs/clear.md)."""
    return f["pgid"] > 0 and f["sid"] > 0


def _descends(by_pid: dict[int, tuple[str, dict[str, Any]]], f: dict[str, Any], ancestor: int) -> bool:
    seen = set()
    cur = f
    while cur["ppid"] in by_pid and cur["ppid"] not in seen:
        if cur["ppid"] == ancestor:
            return True
        seen.add(cur["ppid"])
        cur = by_pid[cur["ppid"]][1]
    return cur["ppid"] == ancestor


def check_names(o: Observed, act: dict[str, Any]) -> list[dict[str, str]]:
    """None of our processes is protected by a kernel fact: a name-based reason is a name it chose."""
    out = []
    _, spared = _verdicts(act)
    for lab, f in o.before.items():
        s = spared.get(f["pid"])
        if f["kind"] == "node" and s is not None and _NAME_REASON.search(s["reason"]):
            out.append(V("name-protected", f"{lab} pid {f['pid']} renamed {f['title']!r} spared: {s['reason']}"))
    return out


def _candidates(o: Observed) -> list[dict[str, Any]]:
    """A superset of the holders the selection may select (uid and protection aside)."""
    sel = o.selection
    chosen = set(sel["gpus"]) if sel["gpus"] is not None else None
    by_pid = {f["pid"]: ("", f) for f in o.before.values()}
    family: set[int] | None = None
    if sel["pids"]:
        family = set()
        for p in sel["pids"]:
            family.add(p)
            for f in o.before.values():
                if _descends(by_pid, f, p) or (p in by_pid and by_pid[p][1]["pgid"] == p and f["pgid"] == p):
                    family.add(f["pid"])
        for f in o.before.values():  # descendants of the group members too
            if any(_descends(by_pid, f, m) for m in list(family)):
                family.add(f["pid"])
    out = []
    for f in o.before.values():
        gpus = {g for g, _ in f["holds"]} | (set(f["handles"]) if sel["include_handles"] else set())
        if not gpus or (chosen is not None and not gpus & chosen):
            continue
        if family is not None and f["pid"] not in family:
            continue
        if sel["user"] is not None and f["uid"] != o.user_uids.get(sel["user"]):
            continue
        if sel["match"] is not None and not _matched(sel["match"], f):
            continue
        out.append(f)
    return out


def _matched(pattern: str, f: dict[str, Any]) -> bool:
    """--match as gpuslate applies it: the command line (its first 4 KiB) or the kernel's name. A node
    exec'd under another user's Python without setproctitle keeps ``python3 node.py ...`` as its
    command line whatever its title: a pattern can select it by that."""
    return any(re.search(pattern, text) for text in (f["title"], f.get("cmdline", "")[:4096], f["name"]))


def check_related(o: Observed, act: dict[str, Any]) -> list[dict[str, str]]:
    """Every target is in the job of a selected holder: in the subtree of the holder or of an
    ancestor in the holder's group, or in that group (a known one: see :func:`_known`)."""
    by_pid = {f["pid"]: ("", f) for f in o.before.values()}
    cands = _candidates(o)
    roots: set[int] = set(o.selection["pids"])  # what --pid names is selected by the user's word
    groups: set[int] = set()
    for h in cands:
        roots.add(h["pid"])
        if _known(h):
            groups.add(h["pgid"])
            cur = by_pid.get(h["ppid"])
            while cur is not None and cur[1]["pgid"] == h["pgid"]:
                roots.add(cur[1]["pid"])
                cur = by_pid.get(cur[1]["ppid"])
    out = []
    for t in act["targets"]:
        f = by_pid.get(t["pid"], (None, None))[1]
        if f is None or t["role"] == "forked while stopping" or (f["pid"], f["ticks"]) != (t["pid"], t["start_ticks"]):
            continue
        members = roots | {g["pid"] for g in o.before.values() if g["pgid"] in groups}
        related = f["pid"] in members or any(_descends(by_pid, f, r) for r in members)
        if not related:
            out.append(V("target-unrelated", f"{t['pid']} ({f['title']}, pgid {f['pgid']}, role {t['role']}: "
                                             f"{t['reason']}) is in the job of no selected holder"))
    return out


def check_refusal(o: Observed) -> list[dict[str, str]]:
    """A --pid refused as protected: never for a name one of our processes gave itself."""
    m = re.search(r"(\d+) is (.*): it is never a target", o.act.get("error") or "")
    if not m:
        return []
    f = next((f for f in o.before.values() if f["pid"] == int(m.group(1))), None)
    if f is not None and f["kind"] == "node" and _NAME_REASON.search(m.group(2)):
        return [V("name-protected", f"--pid {f['pid']} (renamed {f['title']!r}) refused: {m.group(0)}")]
    return []
