"""The learned policy (issues 23, 34): its moves and their masks, its bound on reordering, its
explanation, the shipped weights, the Gymnasium environment over the simulator, imitation
of a teacher, and the numpy scorer against torch's."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys

import numpy as np
import pytest

from marbled.core.features import (
    ACTIONS,
    COUNTS,
    DIM,
    GLOBAL,
    NOTHING,
    PRIOR,
    RESIZE,
    ROW,
    WINDOW,
    observe,
)
from marbled.core.model import Job, JobState, Node, Placement, Role, Start, State, Suspend
from marbled.core.policy import get_policy
from marbled.core.policy.learned import WEIGHTS, LearnedPolicy, Network, fifo_pick
from marbled.resources import load_profile, workload_path
from marbled.sim.engine import Simulator
from marbled.sim.generators import production
from marbled.sim.workloads import Arrival, from_job_file, poisson

BOOK = load_profile("summit-v100")
MIX = dict.fromkeys(("resnet-50", "inception-v3", "resnet-101", "vgg-16", "lenet"), 1.0)


def last(obs, state, now) -> int:
    """An agent that starts the latest job it may (on its most GPUs), to test the bound."""
    starts = np.flatnonzero(obs.mask[:RESIZE])
    if not len(starts):
        return NOTHING if obs.mask[NOTHING] else int(np.flatnonzero(obs.mask)[0])
    latest = starts[-1] // COUNTS
    return int(starts[starts // COUNTS == latest][-1])


def times(result) -> dict[int, tuple[float, float]]:
    return {i: (j.first_start, j.completion) for i, j in result.jobs.items()}


def _nodes(n: int, gpus: int = 4) -> State:
    return State(nodes={f"n{i}": Node(f"n{i}", tuple(range(gpus))) for i in range(n)})


def test_observation_shape_range_and_mask():
    state = _nodes(2)
    curve = BOOK.lookup("resnet-50")  # runs on 1-6 GPUs
    for i in range(1, 14):
        state.submit(Job(i, 4 if i == 2 else 1, i == 2, curve=curve if i == 2 else None,
                         steps_left=1000.0, submitted=10.0 * i))
    obs = observe(state, 200.0, 10)
    assert obs.vector.shape == (DIM,) and obs.vector.dtype == np.float32
    assert obs.vector.min() >= -1 and obs.vector.max() <= 1
    assert [j.id for j in obs.jobs] == list(range(1, WINDOW + 1))  # the window: the first 8
    # job 1 (rigid, 1 GPU): its count alone; job 2 (resizable, demand 4): 1 to 4 GPUs
    assert np.flatnonzero(obs.mask[:COUNTS]).tolist() == [0]
    assert np.flatnonzero(obs.mask[COUNTS:2 * COUNTS]).tolist() == [0, 1, 2, 3]
    # nothing runs: nothing to move, and "nothing" is refused (an idle cluster starts a job)
    assert not obs.mask[RESIZE:].any()
    # each allowed row says so, and is the move's; the refused rows are zeros
    rows = obs.rows
    assert (rows[obs.mask[:NOTHING].nonzero()[0], 0] == 1).all()
    assert not rows[~obs.mask].any()
    assert obs.moves[COUNTS + 3] == Start(2, "n0", (0, 1, 2, 3), Role.PRIMARY)
    assert obs.moves[COUNTS] == Start(2, "n0", (0,), Role.SECONDARY)


def test_the_priors_moves_are_marked_in_their_rows():
    """The prior's decision (elastic's: a resizable job starts on its fewest GPUs) marks
    the rows of the moves that make it, and only those; a decision of no move of the view
    marks "nothing" where it is allowed. The learned policy marks its prior's."""
    state = _nodes(2)
    curve = dataclasses.replace(BOOK.lookup("resnet-50"), startup_s=10.0, suspend_s=10.0)
    state.submit(Job(1, 4, True, curve=curve, steps_left=1000.0, submitted=0.0))
    state.submit(Job(2, 2, False, submitted=0.0))
    prior = get_policy("elastic").choose(state, 0.0)
    assert [len(a.gpus) for a in prior] == [1, 2]
    obs = observe(state, 0.0, 10, prior=prior)
    marked = np.flatnonzero(obs.rows[:, PRIOR]).tolist()
    assert marked == [0, COUNTS + 1] == [obs.index(a) for a in prior]
    assert np.array_equal(LearnedPolicy(pick=fifo_pick).observe(state, 0.0).vector, obs.vector)
    state.apply(obs.moves[0])
    state.apply(obs.moves[COUNTS + 1])
    state.expect(1, 9000.0)
    # a move the view lacks (elastic grows job 1 after 300 s; a guard of 1000 x 20 s bars it)
    grow = get_policy("elastic").choose(state, 400.0)
    assert grow and obs.index(grow[0]) is None
    obs = observe(state, 400.0, 10, guard=1000.0, prior=grow)
    rows = obs.rows
    assert obs.mask[NOTHING] and np.flatnonzero(rows[:, PRIOR]).tolist() == [NOTHING]
    assert np.flatnonzero(observe(state, 400.0, 10, prior=grow).vector[GLOBAL:].reshape(
        ACTIONS, ROW)[:, PRIOR]).tolist() == [observe(state, 400.0, 10).index(grow[0])]


def test_the_prior_weight_leans_the_pick_to_the_priors_move():
    """A network that scores every move alike picks the first allowed (a stop); with a
    prior weight it picks elastic's (a doubling of the stable run), and the policy wakes
    when elastic would grow a run, after the prior's --grow-after."""
    state = _nodes(1)
    curve = dataclasses.replace(BOOK.lookup("resnet-50"), startup_s=10.0, suspend_s=10.0)
    state.submit(Job(1, 4, True, curve=curve, steps_left=1e6, submitted=0.0))
    state.apply(Start(1, "n0", (0,), Role.SECONDARY), 0.0)
    state.expect(1, 90_000.0)
    flat = Network((np.zeros((GLOBAL + ROW, 1)),), (np.zeros(1),))
    assert LearnedPolicy(network=flat, prior_weight=0.0).next_decision(state, 0.0) == 300.0
    [stop] = LearnedPolicy(network=flat, prior_weight=0.0).choose(state, 400.0)
    assert stop == Suspend(1, None, "learned: back to the queue")
    [grow] = LearnedPolicy(network=flat, prior_weight=0.5).choose(state, 400.0)
    assert grow.resume_on == Placement("n0", (0, 1)) == get_policy("elastic").choose(
        state, 400.0)[0].resume_on
    # --grow-after is the prior's: it grows, and the policy wakes, that much sooner
    # (the move guard of 10 moves costs 200 s: none before then without --move-guard 0)
    sooner = LearnedPolicy(network=flat, prior_weight=0.5, grow_after=60.0, move_guard=0.0)
    assert sooner.next_decision(state, 0.0) == 60.0
    assert sooner.choose(state, 100.0)[0].resume_on == Placement("n0", (0, 1))
    assert LearnedPolicy(network=flat, prior_weight=0.5, move_guard=0.0).choose(
        state, 100.0) == []  # elastic makes no move yet: nothing


def test_packing_takes_the_fullest_node_that_fits():
    state = _nodes(3)
    state.submit(Job(1, 3, False))
    state.submit(Job(2, 1, False))
    state.submit(Job(3, 2, False))
    state.apply(Start(1, "n1", (0, 1, 2), Role.PRIMARY))
    state.apply(Start(2, "n2", (0,), Role.PRIMARY))
    obs = observe(state, 0.0, 10)
    # n2 has 3 free, n0 4: the fewest that fit
    assert obs.moves == {1: Start(3, "n2", (1, 2), Role.PRIMARY)}
    assert not obs.mask[NOTHING]  # n0 is idle and job 3 could use it
    state.apply(obs.moves[1])
    state.submit(Job(4, 4, False))
    obs = observe(state, 0.0, 10)
    assert obs.moves[3].node == "n0" and not obs.mask[NOTHING]


def test_a_running_job_may_grow_shrink_move_or_stop_once_it_trains():
    state = _nodes(2)
    # demand 6 on the profile: 1-4 here; a launch and a checkpoint of 10 s each
    curve = dataclasses.replace(BOOK.lookup("resnet-50"), startup_s=10.0, suspend_s=10.0)
    state.submit(Job(1, 4, True, curve=curve, steps_left=1e6, submitted=0.0))
    state.submit(Job(2, 2, False, submitted=0.0))
    state.apply(Start(1, "n0", (0, 1), Role.SECONDARY), 0.0)
    state.apply(Start(2, "n1", (0, 1), Role.PRIMARY), 0.0)
    state.expect(1, 5000.0)
    assert not observe(state, 9.0, 10).mask[RESIZE:NOTHING].any()  # it is still launching
    assert not observe(state, 199.0, 10, guard=10).running  # the guard: 10 x 20 s
    assert observe(state, 200.0, 10, guard=10).running
    obs = observe(state, 1000.0, 10)
    assert [j.id for j in obs.running] == [1]
    allowed = {a - RESIZE: m for a, m in obs.moves.items() if a >= RESIZE}
    assert set(allowed) == {0, 1, 3, 4}  # stop, 1, 3 or 4 GPUs; not its own 2
    assert allowed[0] == Suspend(1, None, "learned: back to the queue")
    assert allowed[1].resume_on == Placement("n0", (0,))
    assert allowed[4].resume_on == Placement("n0", (0, 1, 2, 3))
    # n0 full: growing to 3 moves it to the other node, where 2 GPUs are free... not 3
    state.submit(Job(3, 2, False, submitted=0.0))
    state.apply(Start(3, "n0", (2, 3), Role.PRIMARY), 1000.0)
    moves = {a - RESIZE: m for a, m in observe(state, 1000.0, 10).moves.items() if a >= RESIZE}
    assert set(moves) == {0, 1}
    for move in moves.values():  # every allowed move is a legal action of the state
        copy = State(nodes=state.nodes)
        for j in (1, 2, 3):
            job = state.jobs[j]
            copy.submit(Job(j, job.demand, job.malleable, curve=job.curve))
            copy.apply(Start(j, job.placement.node, job.gpus, job.role), 0.0)
        copy.apply(move, 1000.0)


def test_random_moves_keep_the_invariants_every_policy_keeps():
    """An agent that picks uniformly among the allowed moves, with no move guard, on 2
    nodes of a production trace (30 % rigid): each decision passes the property tests'
    checks of a decision and of the state after it (`tests/core/test_policy_invariants.py`,
    whose time-less driver never lets a run train long enough to be moved), the simulator
    takes every move, and every job ends."""
    from tests.core.test_policy_invariants import check_decision, check_state

    rng = np.random.default_rng(0)
    moves = []

    class Checked(LearnedPolicy):
        def decide(self, state, now=0.0):
            before = State(nodes=state.nodes, jobs=dict(state.jobs))
            actions = super().decide(state, now)
            check_decision("learned", before, actions)
            moves.extend(a for a in actions if isinstance(a, Suspend))
            return actions

        def next_decision(self, state, now):
            # at events only: woken when the prior would grow a run, the random agent
            # moved runs so often that the test took 45 s instead of 1.4
            return None

    def pick(obs, state, now):
        check_state(state)
        return int(rng.choice(np.flatnonzero(obs.mask)))

    workload = production(7, book=BOOK, nodes=2, gpus_per_node=6, load=0.9, jobs=40)
    r = Simulator(BOOK, Checked(pick=pick, move_guard=0.0), 6, 2, 10.0, 10.0).run(workload)
    assert all(j.completion for j in r.jobs.values()) and len(r.jobs) == 40
    # (a move of a run not yet at its first step is refused by the driver, lifecycle I6,
    # and one ending before its checkpoint ends it: fewer suspensions than moves decided)
    assert len(moves) >= r.suspensions > 20
    assert any(m.resume_on is None for m in moves)  # stops, and moves to other nodes
    assert any(m.resume_on and "on node" in m.reason for m in moves)


def test_the_bound_stops_reordering():
    """An agent that always starts the latest job lets job 1 (all 4 GPUs) be passed at
    most --max-overtaken times."""
    arrivals = [Arrival(0.0, spec) for spec in
                [*_specs([4]), *_specs([1] * 12)]]
    for bound in (0, 2, 5):
        policy = LearnedPolicy(pick=last, max_overtaken=bound)
        r = Simulator(BOOK, policy, 4, 1, 0.0, 0.0).run(arrivals)
        before = [i for i, j in r.jobs.items() if i > 1 and j.first_start < r.jobs[1].first_start]
        assert len(before) == bound, (bound, before)
    # with no bound met, the agent's order stands: the latest job of the window first
    r = Simulator(BOOK, LearnedPolicy(pick=last, max_overtaken=50), 4, 1, 0, 0).run(arrivals)
    assert r.jobs[WINDOW].first_start == 0.0 and r.jobs[1].first_start > 0.0


def _specs(gpus: list[int]):
    from marbled.core.spec import JobSpec
    return [JobSpec(model="lenet", steps=1000, gpus=g) for g in gpus]


def test_explain_names_the_jobs_best_move_and_the_pick():
    policy = get_policy("learned")
    state = _nodes(1)
    curve = BOOK.lookup("resnet-50")
    for i in range(1, 5):
        state.submit(Job(i, 2, True, curve=curve, steps_left=1000.0 * i, submitted=0.0))
    state.apply(Start(1, "n0", (0, 1), Role.PRIMARY))
    state.expect(1, 500.0)
    line = policy.explain(state.jobs[3], state, 10.0)
    p = r"\(0\.\d{3}(, elastic's move)?\)"  # its probability; whether the prior makes it
    assert re.fullmatch(r"is in the learned policy's window \(position 2\); its best move: "
                        rf"start job 3 on [12] GPUs? {p}; the pick: .+ {p}"
                        rf"(, runner-up: .+ {p})?", line), line
    # elastic starts job 2 on its fewest GPU, job 3 next: the job's own move is the prior's
    assert re.search(r"its best move: start job 3 on 1 GPU \(0\.\d{3}, elastic's move\);", line)
    state.apply(Start(2, "n0", (2, 3), Role.PRIMARY))
    full = policy.explain(state.jobs[3], state, 10.0)
    assert full == "needs 1 GPU on one node; the most free on a node is 0"


def test_explain_behind_the_window_and_under_the_bound():
    policy = get_policy("learned", max_overtaken=1)
    state = _nodes(1)
    state.submit(Job(1, 4, False, submitted=0.0))
    for i in range(2, 14):
        state.submit(Job(i, 1, False, submitted=0.0))
    assert policy.explain(state.jobs[12], state, 5.0) == (
        "waits behind the first 8 ready jobs, the only ones the learned policy picks from")
    state.apply(Start(2, "n0", (0,), Role.PRIMARY))  # job 2 went before job 1: the bound
    assert policy.explain(state.jobs[3], state, 5.0) == (
        "waits for job 1: 1 later jobs started before it (--max-overtaken), so it goes next")


def test_shipped_weights_are_small_and_say_how_they_were_trained():
    assert WEIGHTS.stat().st_size < 1_000_000
    record = json.loads(WEIGHTS.with_suffix(".json").read_text())
    for key in ("seed", "teacher", "dagger_rounds", "wall_s", "workloads", "versions",
                "command"):
        assert key in record
    net = Network.load(WEIGHTS)
    assert net.weights[0].shape[0] == GLOBAL + ROW and net.weights[-1].shape[1] == 1


def test_a_missing_weights_file_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("MARBLE_LEARNED_WEIGHTS", str(tmp_path / "none.npz"))
    with pytest.raises(ValueError, match="no weights file .*none.npz; set MARBLE_LEARNED_WEIGHTS"):
        get_policy("learned")


def test_the_policy_needs_neither_torch_nor_gymnasium():
    code = ("import sys; from marbled.core.policy import get_policy; "
            "from marbled.core.model import State, Job; s = State.single_node(4); "
            "s.submit(Job(1, 2, False)); print(get_policy('learned').decide(s, 0.0)); "
            "print([m for m in ('torch', 'gymnasium', 'stable_baselines3') if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[Start(job=1, node='node0', gpus=(0, 1), "
                                        "role=<Role.PRIMARY: 'primary'>, others=(), share=1)]",
                                        "[]"]


def test_learned_runs_workloads_to_their_end_and_never_leaves_a_node_idle():
    """Every job of a Poisson workload (30 % rigid) on 3 nodes and a paper job set runs to
    its end; at no decision is a node left idle while a waiting job could start on it."""
    idle_with_work = []

    class Watched(LearnedPolicy):
        def choose(self, state, now):
            actions = super().choose(state, now)
            if not actions and not any(j.state is JobState.SUSPENDING
                                       for j in state.engaged()):
                obs = self.observe(state, now)
                if obs.mask[:RESIZE].any() and any(
                        len(state.free(n)) == state.nodes[n].size for n in state.nodes):
                    idle_with_work.append(now)
            return actions

    arrivals = poisson(200, 60.0, MIX, (500, 5000), 7, 0.3)
    r = Simulator(BOOK, Watched(), BOOK.gpus_per_node, 3, 5.0, 5.0).run(arrivals)
    assert len(r.jobs) == 200 and all(j.completion for j in r.jobs.values())
    assert r.makespan >= r.lower_bound
    jobset = from_job_file(workload_path("paper-jobset2"))
    r = Simulator(BOOK, Watched(), BOOK.gpus_per_node).run(jobset)
    assert len(r.jobs) == len(jobset) and r.makespan >= r.lower_bound
    assert not idle_with_work


# ---------------------------------------------------------------- the environment

gym = pytest.importorskip("gymnasium")


def _env(workload, nodes=2, **kw):
    from marbled.sim.env import SchedulingEnv
    return SchedulingEnv(BOOK, workload, gpus_per_node=BOOK.gpus_per_node, nodes=nodes, **kw)


def _episode(env, agent=fifo_pick, seed=0):
    obs, _ = env.reset(seed=seed)
    rewards, done = [], False
    while not done:
        action = agent(env._obs, None, 0.0)
        assert env.action_masks()[action]
        obs, reward, done, truncated, _ = env.step(action)
        rewards.append(reward)
        assert not truncated
    return rewards


def test_check_env_passes():
    from gymnasium.utils.env_checker import check_env

    env = _env(lambda rng: poisson(30, 60.0, MIX, (500, 5000), rng.randrange(1000), 0.3))
    check_env(env, skip_render_check=True)
    env.close()


def test_fifo_choices_reproduce_marble_simulate():
    """One node, jobs with their own GPU counts: the FIFO agent under a bound of 0 is the
    rigid policy (strict FIFO, head-of-line blocking): same start and end of every job.
    On three nodes it is the simulator under the same choices, job for job."""
    rigid = poisson(80, 40.0, MIX, (500, 5000), 3, 1.0)
    env = _env(rigid, nodes=1, max_overtaken=0)
    _episode(env)
    want = Simulator(BOOK, get_policy("rigid"), BOOK.gpus_per_node, 1).run(rigid)
    assert times(env.result) == times(want)

    mixed = poisson(120, 90.0, MIX, (500, 5000), 4, 0.3)
    env = _env(mixed, nodes=3)
    _episode(env)
    want = Simulator(BOOK, LearnedPolicy(pick=fifo_pick), BOOK.gpus_per_node, 3).run(mixed)
    assert times(env.result) == times(want)
    assert env.result.makespan == want.makespan
    env.close()


@pytest.mark.parametrize("teacher", ["malleable", "adaptive"])
def test_an_episode_of_the_teachers_choices_is_the_teachers_simulation(teacher):
    """The environment stepped with the teacher's label at every decision runs the
    workload as the teacher does alone in the simulator: every job starts and ends at the
    same times (resizes and stops included)."""
    from marbled.sim.imitate import Teacher

    workload = production(5, book=BOOK, nodes=1, gpus_per_node=6, load=0.9, jobs=30)
    want = Simulator(BOOK, get_policy(teacher), BOOK.gpus_per_node, 1, 10.0, 10.0).run(workload)
    expert = Teacher(get_policy(teacher))
    env = _env(workload, nodes=1, launch_s=10.0, suspend_s=10.0, wake=expert.next_decision,
               move_guard=0.0)
    env.reset(seed=0)
    done = False
    while not done:
        state, now = env._state, env._now
        label = expert.label(env._obs, state, now)
        assert label is not None, "a decision of the teacher's that no move makes"
        _, _, done, _, _ = env.step(label)
    assert want.suspensions > 0  # the teacher moved jobs
    assert times(env.result) == times(want)
    env.close()


def test_rewards_add_up_to_what_they_stand_for():
    arrivals = poisson(60, 60.0, MIX, (500, 5000), 5, 0.3)
    env = _env(arrivals)
    effectiveness = _episode(env)
    assert all(0 <= r <= 1 for r in effectiveness) and max(effectiveness) == 1.0
    r = env.result
    env = _env(arrivals, reward="jct")
    jct = _episode(env)
    assert sum(jct) == pytest.approx(-r.total_jct / 3600, rel=1e-9) and not any(jct[:-1])
    env = _env(arrivals, reward="makespan")
    assert sum(_episode(env)) == pytest.approx(-r.makespan / 3600, rel=1e-9)
    with pytest.raises(ValueError, match="reward: 'speed' is not one of effectiveness, jct"):
        _env(arrivals, reward="speed")


def test_reset_abandons_an_episode_midway():
    env = _env(poisson(40, 60.0, MIX, (500, 5000), 6))
    env.reset(seed=1)
    env.step(fifo_pick(env._obs, None, 0))
    thread = env._thread
    env.reset(seed=2)
    assert not thread.is_alive()
    env.close()
    assert env._thread is None


# ---------------------------------------------------------------- learning

def test_imitation_on_a_tiny_workload_reduces_the_loss():
    """Labels of the adaptive teacher on two small production traces: the scorer's loss
    falls and it agrees with the teacher more than the untrained one does."""
    pytest.importorskip("sb3_contrib")
    from marbled.sim import scorer
    from marbled.sim.imitate import agreement, collect

    episodes = [(f"prod-s{s}", production(s, book=BOOK, nodes=2, gpus_per_node=6, load=0.9,
                                          jobs=30), 2, 6) for s in (1_000_001, 1_000_002)]
    data, outcomes = collect(episodes, "adaptive", None, 1.0, 0, "summit-v100", (10.0, 10.0))
    assert len(data) > 100 and data.target.sum() >= len(data)
    assert all(o["average_jct"] > 0 for o in outcomes)
    mlp = scorer.scorer_module((32, 32))
    before = agreement(scorer.export(mlp), data)
    losses = scorer.fit(mlp, data, epochs=40, seed=0, lr=3e-3, batch=64)
    assert losses[-1] < 0.7 * losses[0]
    assert agreement(scorer.export(mlp), data) > max(before, 0.6)


def test_numpy_forward_pass_equals_the_torch_scorer_and_ppo_starts_from_it():
    pytest.importorskip("sb3_contrib")
    import torch
    from sb3_contrib import MaskablePPO

    from marbled.sim.scorer import ScorerPolicy, export, score, scorer_module

    env = _env(poisson(40, 60.0, MIX, (500, 5000), 8, 0.3))
    obs, _ = env.reset(seed=0)
    samples, masks = [obs], [env.action_masks()]
    while len(samples) < 20:
        obs, _, done, _, _ = env.step(fifo_pick(env._obs, None, 0))
        if done:
            obs, _ = env.reset()
        samples.append(obs)
        masks.append(env.action_masks())
    torch.manual_seed(0)
    mlp = scorer_module((16, 16))
    net = export(mlp)
    x, m = torch.as_tensor(np.stack(samples)), np.stack(masks)
    with torch.no_grad():
        want = score(mlp, x).numpy()
    got = np.stack([net.logits(s.astype(np.float64)) for s in samples])
    assert np.abs(got - want).max() < 1e-5
    masked = np.stack([net.logits(s.astype(np.float64), k)
                       for s, k in zip(samples, m, strict=True)])
    assert np.array_equal(np.isfinite(masked), m)
    assert np.abs(masked[m] - want[m]).max() < 1e-5
    model = MaskablePPO(ScorerPolicy, env, n_steps=64, batch_size=32, n_epochs=1,
                        policy_kwargs={"hidden": (16, 16)}, device="cpu", seed=0)
    model.policy.mlp_extractor.actor.load_state_dict(mlp.state_dict())
    with torch.no_grad():
        dist = model.policy.get_distribution(x, action_masks=m)
    assert np.abs(dist.distribution.logits.numpy()[m]
                  - torch.log_softmax(torch.as_tensor(masked), 1).numpy()[m]).max() < 1e-4
    model.learn(64)  # a PPO update runs on the scorer
    env.close()
