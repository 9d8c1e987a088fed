"""The epilog's second rule, ``leftover.decide``, against random holders and random nodes as Slurm
may show them (issue 24):

* what it finds is the job's user's, on the job's GPUs, carrying no other job's id or cgroup,
  started in the job's window, on GPUs no other present job holds, started before every other
  present job of the user, on a node whose GPUs Slurm shows exclusive; never gpuslate's lineage;
* every candidate it does not find is named in ``unproven`` with a reason, and nothing else is;
* unknown never widens: making any fact unknown (Slurm unreadable, the window, a job's GPUs, its
  uid or start) or adding sharing (mps/shard, OverSubscribe, another job on the GPU, another job
  of the user) never adds a process to what is found;
* another present job of the same user is never reached through a holder it may have started.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpuslate.slurm.leftover import Holder, Slurm, Window, candidates, decide
from gpuslate.slurm.scontrol import JobOnNode, NodeJobs

J, U = 42, 1000
GPUS = frozenset({0, 1})

def _mostly(usual, *rare):
    """``usual`` four times in five: a random node is rarely one where anything can be shown."""
    return st.sampled_from([usual] * 4 + list(rare))


holders = st.builds(Holder, st.integers(1, 30), _mostly(U, 0, 2000, None), st.integers(0, 300),
                    _mostly(None, J, 43), _mostly(frozenset(), frozenset({43}), frozenset({J})),
                    st.frozensets(st.integers(0, 3), min_size=1, max_size=2), _mostly(None, 99),
                    st.sampled_from([None, J, 43]))
jobs = st.builds(JobOnNode, st.sampled_from([43, 44, 45]), _mostly(2000, U, None),
                 st.sampled_from(["RUNNING", "COMPLETING", "COMPLETED", "CANCELLED+COMPLETING", "PENDING"]),
                 st.just(None), st.just(None),
                 _mostly(frozenset({3}), frozenset({0}), frozenset(), frozenset({2, 3}), None), _mostly(False, True))
slurms = st.builds(
    lambda others, shared, over, error, window, starts: Slurm(
        NodeJobs("n1", (JobOnNode(J, U, "COMPLETING", 0, 0, GPUS, False), *others), shared, over, error),
        window, starts),
    st.lists(jobs, max_size=2), _mostly(False, True), _mostly((), ("test",)), _mostly(None, "scontrol failed: boom"),
    st.one_of(st.none(), st.builds(Window, st.integers(0, 100), st.integers(150, 300)),
              st.builds(Window, st.integers(0, 100), st.integers(150, 300))),
    st.dictionaries(st.sampled_from([43, 44, 45]), st.integers(0, 300), max_size=3))
#: nodes where everything can be shown: other users' jobs on the other GPUs
good_slurms = st.builds(
    lambda others, window: Slurm(NodeJobs("n1", (JobOnNode(J, U, "COMPLETING", 0, 0, GPUS, False), *others),
                                          False, ()), window, {}),
    st.lists(st.builds(JobOnNode, st.sampled_from([43, 44]), st.just(2000), st.just("RUNNING"), st.just(None),
                       st.just(None), st.frozensets(st.integers(2, 3), max_size=2), st.just(False)), max_size=2),
    st.builds(Window, st.integers(0, 100), st.integers(150, 300)))
any_slurms = st.one_of(slurms, good_slurms)
lineages = st.frozensets(st.integers(1, 30), max_size=3)


def _found(hs, slurm, lineage=frozenset()):
    return set(decide(hs, J, U, GPUS, slurm, lineage)[0])


@given(st.lists(holders, max_size=8, unique_by=lambda h: h.pid), any_slurms, lineages)
def test_what_it_finds_is_shown_to_be_the_jobs(hs, slurm, lineage):
    found, unproven = decide(hs, J, U, GPUS, slurm, lineage)
    cands = {h.pid for h in candidates(hs, J, U, GPUS, lineage)}
    assert set(found) | {u.pid for u in unproven} == cands  # each candidate: found or named, nothing else
    assert all(u.reason for u in unproven)
    nodes = slurm.nodes
    for h in (h for h in hs if h.pid in found):
        assert h.uid == U and h.memory & GPUS and h.pid not in lineage
        assert h.env_job is None and not h.cgroup_jobs
        assert h.leader is None or h.leader_job == J  # a live, intact session leader is in the job
        assert nodes.error is None and slurm.window is not None and not nodes.shared_gres
        assert not nodes.oversubscribe
        assert slurm.window.start <= h.start_ticks < slurm.window.end
        for j in nodes.jobs:
            if j.job_id == J or not j.present:
                continue
            assert j.gpus is not None and not j.shares and not j.gpus & h.memory
            if j.uid in (U, None):  # a job of the user present when it started could have started it
                assert j.job_id in slurm.starts and h.start_ticks < slurm.starts[j.job_id]


@given(st.lists(holders, max_size=8, unique_by=lambda h: h.pid), any_slurms, st.data())
def test_unknown_or_sharing_never_widens(hs, slurm, data):
    before = _found(hs, slurm)
    nodes = slurm.nodes
    worse = data.draw(st.sampled_from(["error", "window", "shared", "over", "gpus", "uid", "start", "job"]))
    if worse == "error":
        slurm = slurm._replace(nodes=nodes._replace(error="unknown"))
    elif worse == "window":
        slurm = slurm._replace(window=None)
    elif worse == "shared":
        slurm = slurm._replace(nodes=nodes._replace(shared_gres=True))
    elif worse == "over":
        slurm = slurm._replace(nodes=nodes._replace(oversubscribe=("p",)))
    elif worse == "gpus":
        slurm = slurm._replace(nodes=nodes._replace(jobs=tuple(j._replace(gpus=None) for j in nodes.jobs
                                                               if j.job_id != J) + nodes.jobs[:1]))
    elif worse == "uid":
        slurm = slurm._replace(nodes=nodes._replace(jobs=tuple(j._replace(uid=None) if j.job_id != J else j
                                                               for j in nodes.jobs)))
    elif worse == "start":
        slurm = slurm._replace(starts={})
    else:  # one more job present on the node, of the user, on a GPU, started at any time
        extra = data.draw(st.builds(JobOnNode, st.just(46), st.sampled_from([U, None]), st.just("RUNNING"),
                                    st.just(None), st.just(None),
                                    st.frozensets(st.integers(0, 3), max_size=2), st.booleans()))
        slurm = slurm._replace(nodes=nodes._replace(jobs=(*nodes.jobs, extra)),
                               starts={**slurm.starts, 46: data.draw(st.integers(0, 300))})
    assert _found(hs, slurm) <= before


@given(st.lists(holders, max_size=8, unique_by=lambda h: h.pid), any_slurms)
def test_a_running_job_of_the_user_started_before_the_holder_keeps_it(hs, slurm):
    """Whatever else is shown, a holder started while another job of the user was present is never
    taken: that job could have started it (renamed or not)."""
    other = JobOnNode(43, U, "RUNNING", None, None, frozenset({3}), False)
    slurm = slurm._replace(nodes=slurm.nodes._replace(jobs=(*slurm.nodes.jobs, other)), starts={**slurm.starts, 43: 0})
    assert _found(hs, slurm) == set()


@given(st.lists(holders, max_size=8, unique_by=lambda h: h.pid), good_slurms)
def test_where_everything_is_shown_the_jobs_holders_are_found(hs, slurm):
    """The rule is not empty: on such a node every candidate without another job's id or cgroup,
    started in the window, on GPUs no other job holds, is found."""
    found = _found(hs, slurm)
    for h in candidates(hs, J, U, GPUS, frozenset()):
        mine = h.env_job is None and not h.cgroup_jobs and slurm.window.start <= h.start_ticks < slurm.window.end \
            and (h.leader is None or h.leader_job == J)
        clash = any(j.gpus & h.memory for j in slurm.nodes.jobs if j.job_id != J)
        assert (h.pid in found) == (mine and not clash)


def test_the_issue_case_is_found_and_each_fact_matters():
    h = Holder(7, U, 150, None, frozenset(), frozenset({0}))
    base = Slurm(NodeJobs("n1", (JobOnNode(J, U, "COMPLETING", 0, 0, frozenset(), False),
                                 JobOnNode(43, U, "RUNNING", 0, None, frozenset({2}), False)), False, ()),
                 Window(100, 200), {43: 160})
    assert decide([h], J, U, GPUS, base, frozenset()) == ([7], [])
    for changed, why in [
        (base._replace(starts={43: 150}), "job 43 of the same user was running when it started"),
        (base._replace(window=Window(151, 200)), "it started before job 42"),
        (base._replace(window=Window(100, 150)), "it started after job 42 ended"),
        (base._replace(nodes=base.nodes._replace(shared_gres=True)), "mps or shard"),
        (base._replace(nodes=base.nodes._replace(oversubscribe=("test",))), "partition test oversubscribes"),
    ]:
        found, unproven = decide([h], J, U, GPUS, changed, frozenset())
        assert found == [] and len(unproven) == 1 and why in unproven[0].reason, (why, unproven)
    assert decide([h._replace(env_job=43)], J, U, GPUS, base, frozenset())[1][0].reason == \
        "it carries SLURM_JOB_ID=43"
    assert decide([h._replace(memory=frozenset({0, 2}))], J, U, GPUS, base, frozenset())[1][0].reason == \
        "GPU 2 is job 43's"
    assert decide([h._replace(leader=9)], J, U, GPUS, base, frozenset())[1][0].reason == \
        "its session leader, pid 9, is in no job"  # a shell of an ssh into the node
    assert decide([h._replace(leader=9, leader_job=J)], J, U, GPUS, base, frozenset()) == ([7], [])
    assert decide([h], J, U, GPUS, base, frozenset({7})) == ([], [])  # gpuslate's own lineage: never
    assert decide([h._replace(uid=2000)], J, U, GPUS, base, frozenset()) == ([], [])  # another user's
