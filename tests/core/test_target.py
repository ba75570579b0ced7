"""A job's target GPU count and its reason (core/target.py), the one answer `marble curves`,
`status` (WANT), `explain` and the dashboard read; and what MARBLE does with a running job
when it changes (the issue's run on 1 GPU, then 2, where 1 measured faster)."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from marbled.core.explain import reasons
from marbled.core.learning import Knowledge, LearnedBook
from marbled.core.model import Job, JobState, Node, Placement, Role, Start, State, Suspend
from marbled.core.policy import POLICIES, get_policy
from marbled.core.profiles import ProfileBook, ThroughputCurve
from marbled.core.target import (
    EXPLICIT,
    EXPLORE,
    LEARNED,
    PROFILE,
    START,
    explicit,
    gpus_text,
    of_job,
    target,
)

TRUE = (100.0, 150.0, 140.0, 120.0, 100.0, 90.0)  # peaks at 2 GPUs
WRONG = ThroughputCurve("m", (50.0, 90.0, 120.0, 140.0, 150.0, 160.0))  # says 6


def sampled(k: Knowledge, *points: tuple[int, float]) -> Knowledge:
    for g, v in points:
        k = k.with_sample("throughput", v, g)
    return k


def test_each_reason_with_its_count_and_words():
    cases = [
        (Knowledge("m", WRONG), 6, 6, PROFILE, "6 GPUs: its profile's optimum"),
        (Knowledge("m", WRONG), 4, 4, PROFILE,
         "4 GPUs: its profile's optimum, limited by the node's size"),
        (sampled(Knowledge("m", ThroughputCurve("m", TRUE)), (2, 150.0)), 6, 2, PROFILE,
         "2 GPUs: its profile's optimum, which its runs confirm"),
        (Knowledge("new"), 6, 1, START,
         "1 GPU: a model no profile knows starts on 1 GPU and is explored from there"),
        (sampled(Knowledge("new"), (1, 100.0)), 6, 2, EXPLORE,
         "2 GPUs: exploring: 1 GPU measured fastest so far, trying more while a doubling "
         "pays"),
        # one count says the scale, never the shape: the profile's optimum stands
        (sampled(Knowledge("m", WRONG), (6, 90.0)), 6, 6, PROFILE,
         "6 GPUs: its profile's optimum, the same at the 0.562x speed its runs measured"),
        (sampled(Knowledge("m", WRONG), (6, 90.0), (3, 140.0), (1, 100.0)), 6, 2, EXPLORE,
         "2 GPUs: exploring: its profile as its runs corrected it peaks there, not measured "
         "yet"),
        (sampled(Knowledge("m", WRONG), (6, 90.0), (3, 140.0)), 6, 4, EXPLORE,
         "4 GPUs: exploring: its runs contradict its profile's shape; 3 GPUs measured "
         "fastest so far, trying the count beside it"),
        (sampled(Knowledge("m", WRONG), (6, 90.0), (3, 140.0), (1, 100.0), (2, 150.0)), 6, 2,
         LEARNED, "2 GPUs: the optimum of its profile as its runs corrected it"),
        (sampled(Knowledge("new"), (1, 100.0), (2, 80.0)), 6, 1, LEARNED,
         "1 GPU: the fastest count its runs measured"),
    ]
    for know, limit, count, reason, text in cases:
        aim = target(know, limit)
        assert (aim.count, aim.reason, aim.text) == (count, reason, text), (know, limit)
        assert know.next_count(limit) == count  # what the broker sizes jobs by
        assert "None" not in aim.text
    assert explicit(3).reason == EXPLICIT and explicit(3).text.startswith("3 GPUs: it asked")


def test_curves_report_carries_the_same_count_and_reason():
    know = sampled(Knowledge("new"), (1, 100.0), (2, 80.0))
    report = know.report(4)
    assert report["optimum"] == report["next_count"] == 1
    assert report["next_reason"] == target(know, 4).as_dict()
    assert report["next_reason"]["reason"] == LEARNED


def test_a_job_off_its_model_target_says_why():
    aim = target(Knowledge("m", WRONG), 6)
    assert of_job(aim, 6) is aim
    assert of_job(aim, 4, reserved=4).text == \
        "4 GPUs: GPUs reserved for its resume; then 6 GPUs: its profile's optimum"
    assert of_job(aim, 3).text.startswith("3 GPUs: its count at submission")
    assert gpus_text(1) == "1 GPU" and gpus_text(2) == "2 GPUs"


def _events(*moves: tuple[int, int, str]) -> list[tuple[str, dict]]:
    """A job's events: its first run, then each (step, gpus) move asked for `reason`."""
    out = [("started", {"gpus": [0], "role": "primary", "step": 0})]
    for step, gpus, reason in moves:
        out += [("suspend-requested", {"reason": reason}),
                ("resumed", {"gpus": list(range(gpus)), "role": "primary", "step": step})]
    return out


def test_a_doubling_that_did_not_pay_is_undone_and_each_move_has_its_true_name():
    """The issue: an unknown model, one run on 1 GPU then one on 2, 1 measured faster. The
    job is moved to 2 to explore (not a "promotion"), then back to 1, its learned optimum."""
    marble = get_policy("marble")
    state = State.single_node(4)
    state.submit(Job(1, 1, True))
    state.apply(Start(1, "node0", (0,), Role.PRIMARY), at=0.0)

    explore = target(sampled(Knowledge("new"), (1, 100.0)), 4)
    state.resize(1, explore.count, None, explore.move)
    job = state.jobs[1]
    assert (job.demand, job.role, job.move) == (2, Role.SECONDARY, "explore")
    (action,) = marble.decide(state, 10.0)
    assert action == Suspend(1, Placement("node0", (0, 1)), "explore")
    state.apply(action)
    state.suspended(1)
    (resume,) = marble.decide(state, 11.0)
    state.apply(resume, at=11.0)
    assert state.jobs[1].role is Role.PRIMARY and state.jobs[1].move is None

    learned = target(sampled(Knowledge("new"), (1, 100.0), (2, 80.0)), 4)
    state.resize(1, learned.count, None, learned.move)
    job = state.jobs[1]
    assert (job.demand, job.role, len(job.gpus)) == (1, Role.PRIMARY, 2)
    lines = reasons(job, state, marble, 20.0, _events((50, 2, "explore")), aim=learned)
    assert "it aims for 1 GPU: the fastest count its runs measured" in lines
    assert "it holds 2 GPUs, more than it aims for: it is being moved to 1 GPU (learned " \
           "optimum)" in lines
    assert "it was moved to explore its model's curve from 1 to 2 GPUs at step 50, resuming " \
           "from its checkpoint" in lines
    assert not any("promoted" in line for line in lines)

    (action,) = marble.decide(state, 20.0)
    assert action == Suspend(1, Placement("node0", (0,)), "learned optimum")
    state.apply(action)
    state.suspended(1)
    (resume,) = marble.decide(state, 21.0)
    assert resume == Start(1, "node0", (0,), Role.PRIMARY)
    state.apply(resume, at=21.0)
    assert marble.decide(state, 40.0) == []  # on its optimum: left alone


def test_a_move_down_waits_until_it_pays_and_says_so():
    marble = get_policy("marble")
    curve = ThroughputCurve("m", (100.0, 80.0), startup_s=30.0, suspend_s=5.0)
    state = State.single_node(2)
    state.submit(Job(1, 2, True, curve=curve))
    state.apply(Start(1, "node0", (0, 1), Role.PRIMARY), at=0.0)
    state.resize(1, 1, curve, "learned optimum")
    assert marble.decide(state, 10.0) == []  # the run is younger than a move costs (35 s)
    assert "it is moved once its run has lasted longer than a move costs" in \
        " ".join(reasons(state.jobs[1], state, marble, 10.0))
    state.expect(1, 60.0)  # 20 s at 80 steps/s left: 16 s on 1 GPU + 35 s of move
    assert marble.decide(state, 40.0) == []
    assert "moving it would cost more time than it saves, so it keeps them to its end" in \
        " ".join(reasons(state.jobs[1], state, marble, 40.0))
    state.expect(1, 1000.0)
    assert marble.decide(state, 40.0) == [Suspend(1, Placement("node0", (0,)),
                                                  "learned optimum")]


def test_a_policy_that_does_not_shrink_says_so_and_a_secondary_is_still_promoted():
    state = State.single_node(4)
    state.submit(Job(1, 2, True))
    state.apply(Start(1, "node0", (0, 1), Role.PRIMARY), at=0.0)
    state.resize(1, 1, None, "learned optimum")
    rigid = get_policy("rigid")
    assert rigid.decide(state, 50.0) == []
    assert "the rigid policy does not move a running job to fewer GPUs" in \
        " ".join(reasons(state.jobs[1], state, rigid, 50.0))

    state = State.single_node(4)
    state.submit(Job(1, 4, True))
    state.apply(Start(1, "node0", (0, 1), Role.SECONDARY), at=0.0)  # on leftovers
    state.resize(1, 3, None, "learned optimum")
    assert state.jobs[1].move is None  # growing from leftovers stays a promotion
    assert get_policy("marble").decide(state, 5.0) == [
        Suspend(1, Placement("node0", (0, 1, 2)), "promote")]
    assert state.jobs[1].state is JobState.RUNNING


def test_curves_of_a_model_before_any_run_print_no_none():
    from marbled.cli.models import format_curves

    book = LearnedBook(ProfileBook("summit-v100", 6, {"m": WRONG}))
    book.record("novel", "startup", 2.0)  # known to the book, no throughput measured yet
    text = format_curves({"profile": book.system, "learning": True,
                          "models": book.report("novel") + book.report("m")})
    assert "novel: optimum not known yet (no profile), next run on 1 GPU: a model no " \
           "profile knows starts on 1 GPU and is explored from there" in text, text
    assert "m: optimum 6 GPUs (profile: 6 GPUs), next run on 6 GPUs: its profile's " \
           "optimum" in text, text
    assert "None" not in text, text


@given(gpus=st.integers(2, 4), demand=st.integers(1, 3), nodes=st.integers(1, 2),
       startup=st.floats(0, 60), started=st.floats(0, 100), now=st.floats(0, 200),
       end=st.one_of(st.none(), st.floats(0, 5000)), curve_known=st.booleans(),
       policy=st.sampled_from(sorted(POLICIES)))
@settings(max_examples=300, deadline=None)
def test_explain_says_a_job_is_being_moved_exactly_when_the_policy_moves_it(
        gpus, demand, nodes, startup, started, now, end, curve_known, policy):
    """One truth (issue 31): `explain` said 'it is being moved to 2 GPUs (its optimum)'
    of a job its policy never moved. Over random jobs above their demand (one node or
    several, curve known or not, young or settled runs, any time left), the line is there
    exactly when the policy's next decision suspends the job to move it."""
    assume(demand < gpus and now >= started)
    curve = ThroughputCurve("m", tuple(100.0 + 10 * g for g in range(4)), startup_s=startup,
                            suspend_s=5.0) if curve_known else None
    state = State({f"n{i}": Node(f"n{i}", tuple(range(4))) for i in range(nodes)})
    state.submit(Job(1, gpus, True, nodes=nodes, curve=curve))
    others = tuple((f"n{i}", tuple(range(gpus))) for i in range(1, nodes))
    state.apply(Start(1, "n0", tuple(range(gpus)), Role.PRIMARY, others), at=started)
    state.resize(1, demand, curve, "learned optimum")
    if end is not None:
        state.expect(1, end)
    chosen = get_policy(policy)
    moved = any(isinstance(a, Suspend) and a.job == 1 for a in chosen.decide(state, now))
    said = any("it is being moved" in line
               for line in reasons(state.jobs[1], state, chosen, now))
    assert not said or moved  # what it says happens
    assert said or not (moved and chosen.shrinks)  # what the rule it shares does, it says
    denied = any("does not move" in line or "keeps them to its end" in line
                 for line in reasons(state.jobs[1], state, chosen, now))
    assert not (moved and denied), (policy, reasons(state.jobs[1], state, chosen, now))
