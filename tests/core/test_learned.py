"""The learned policy (issue 23): its observation, its bound on reordering, its explanation,
the shipped weights, and the Gymnasium environment over the simulator."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from marbled.core.features import DIM, NOTHING, WINDOW, observe
from marbled.core.model import Job, Node, State
from marbled.core.policy import get_policy
from marbled.core.policy.learned import WEIGHTS, LearnedPolicy, Network
from marbled.resources import load_profile, workload_path
from marbled.sim.engine import Simulator
from marbled.sim.workloads import Arrival, from_job_file, poisson

BOOK = load_profile("summit-v100")
MIX = dict.fromkeys(("resnet-50", "inception-v3", "resnet-101", "vgg-16", "lenet"), 1.0)


def fifo(obs, state, now) -> int:
    """The FIFO agent: the first job that may start, else nothing."""
    return int(np.flatnonzero(obs.mask)[0])


def last(obs, state, now) -> int:
    """An agent that starts the latest job it may, to test the bound."""
    allowed = np.flatnonzero(obs.mask[:NOTHING])
    return int(allowed[-1]) if len(allowed) else NOTHING


def times(result) -> dict[int, tuple[float, float]]:
    return {i: (j.first_start, j.completion) for i, j in result.jobs.items()}


def test_observation_shape_range_and_mask():
    state = State(nodes={f"n{i}": Node(f"n{i}", tuple(range(4))) for i in range(2)})
    for i in range(1, 14):
        state.submit(Job(i, 4 if i == 2 else 1, False, submitted=10.0 * i))
    obs = observe(state, 200.0, 10)
    assert obs.vector.shape == (DIM,) and obs.vector.dtype == np.float32
    assert obs.vector.min() >= -1 and obs.vector.max() <= 1
    assert [j.id for j in obs.jobs] == list(range(1, 11))  # the window: the first 10
    # nothing runs: every job may start, "nothing" may not (an idle cluster starts one)
    assert obs.mask.tolist() == [True] * WINDOW + [False]
    assert obs.places[0] == ("n0", (0,)) and obs.places[1] == ("n0", (0, 1, 2, 3))


def test_packing_takes_the_fullest_node_that_fits():
    state = State(nodes={f"n{i}": Node(f"n{i}", tuple(range(4))) for i in range(3)})
    state.submit(Job(1, 3, False))
    state.submit(Job(2, 1, False))
    state.submit(Job(3, 2, False))
    state.apply(get_start(state, 1, "n1", (0, 1, 2)))
    state.apply(get_start(state, 2, "n2", (0,)))
    obs = observe(state, 0.0, 10)
    assert obs.places == (("n2", (1, 2)),)  # n2 has 3 free, n0 4: the fewest that fit
    assert obs.mask[NOTHING]  # jobs run: holding GPUs free is allowed


def get_start(state, job, node, gpus):
    from marbled.core.model import Role, Start
    return Start(job, node, gpus, Role.PRIMARY)


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
    # with no bound met, the agent's order stands: the latest job first
    r = Simulator(BOOK, LearnedPolicy(pick=last, max_overtaken=50), 4, 1, 0, 0).run(arrivals)
    assert r.jobs[13].first_start == 0.0 and r.jobs[1].first_start > 0.0


def _specs(gpus: list[int]):
    from marbled.core.spec import JobSpec
    return [JobSpec(model="lenet", steps=1000, gpus=g) for g in gpus]


def test_explain_names_the_score_the_pick_and_the_runner_up():
    policy = get_policy("learned")
    state = State(nodes={"n0": Node("n0", tuple(range(4)))})
    curve = BOOK.lookup("resnet-50")
    for i in range(1, 5):
        state.submit(Job(i, 2, True, curve=curve, steps_left=1000.0 * i, submitted=0.0))
    state.apply(get_start(state, 1, "n0", (0, 1)))
    state.expect(1, 500.0)
    line = policy.explain(state.jobs[3], state, 10.0)
    assert line.startswith("is in the learned policy's window (position 2) with score 0.")
    assert "its pick: " in line and "runner-up: " in line
    state.apply(get_start(state, 2, "n0", (2, 3)))
    full = policy.explain(state.jobs[3], state, 10.0)
    assert full == "needs 1 GPU on one node; the most free on a node is 0"


def test_explain_behind_the_window_and_under_the_bound():
    policy = get_policy("learned", max_overtaken=1)
    state = State(nodes={"n0": Node("n0", tuple(range(4)))})
    state.submit(Job(1, 4, False, submitted=0.0))
    for i in range(2, 14):
        state.submit(Job(i, 1, False, submitted=0.0))
    assert policy.explain(state.jobs[12], state, 5.0) == (
        "waits behind the first 10 ready jobs, the only ones the learned policy picks from")
    state.apply(get_start(state, 2, "n0", (0,)))  # job 2 went before job 1: the bound
    assert policy.explain(state.jobs[3], state, 5.0) == (
        "waits for job 1: 1 later jobs started before it (--max-overtaken), so it goes next")


def test_shipped_weights_are_small_and_say_how_they_were_trained():
    assert WEIGHTS.stat().st_size < 1_000_000
    record = json.loads(WEIGHTS.with_suffix(".json").read_text())
    for key in ("seed", "steps", "wall_s", "workloads", "versions", "command"):
        assert key in record
    net = Network.load(WEIGHTS)
    assert net.weights[0].shape[0] == DIM and net.weights[-1].shape[1] == WINDOW + 1


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


def test_learned_runs_a_poisson_workload_and_a_paper_job_set():
    arrivals = poisson(200, 60.0, MIX, (500, 5000), 7, 0.3)
    r = Simulator(BOOK, get_policy("learned"), BOOK.gpus_per_node, 3, 5.0, 5.0).run(arrivals)
    assert len(r.jobs) == 200 and r.suspensions == 0 and len(r.runs) == 200
    jobset = from_job_file(workload_path("paper-jobset2"))
    r = Simulator(BOOK, get_policy("learned"), BOOK.gpus_per_node).run(jobset)
    assert len(r.jobs) == len(jobset) and len(r.runs) == len(jobset)
    assert r.makespan >= r.lower_bound


# ---------------------------------------------------------------- the environment

gym = pytest.importorskip("gymnasium")


def _env(workload, nodes=2, **kw):
    from marbled.sim.env import SchedulingEnv
    return SchedulingEnv(BOOK, workload, gpus_per_node=BOOK.gpus_per_node, nodes=nodes, **kw)


def _episode(env, agent=fifo, seed=0):
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
    want = Simulator(BOOK, LearnedPolicy(pick=fifo), BOOK.gpus_per_node, 3).run(mixed)
    assert times(env.result) == times(want)
    assert env.result.makespan == want.makespan
    env.close()


def test_rewards_add_up_to_what_they_stand_for():
    arrivals = poisson(60, 60.0, MIX, (500, 5000), 5, 0.3)
    env = _env(arrivals)
    effectiveness = _episode(env)
    assert all(0 <= r <= 1 for r in effectiveness) and max(effectiveness) == 1.0
    r = env.result
    env = _env(arrivals, reward="jct")
    assert sum(_episode(env)) == pytest.approx(-r.total_jct / 3600, rel=1e-9)
    env = _env(arrivals, reward="makespan")
    assert sum(_episode(env)) == pytest.approx(-r.makespan / 3600, rel=1e-9)
    with pytest.raises(ValueError, match="reward: 'speed' is not one of effectiveness, jct"):
        _env(arrivals, reward="speed")


def test_reset_abandons_an_episode_midway():
    env = _env(poisson(40, 60.0, MIX, (500, 5000), 6))
    env.reset(seed=1)
    env.step(fifo(env._obs, None, 0))
    thread = env._thread
    env.reset(seed=2)
    assert not thread.is_alive()
    env.close()
    assert env._thread is None


def test_numpy_forward_pass_equals_the_trained_network():
    pytest.importorskip("sb3_contrib")
    import torch

    from marbled.sim.train import export, train

    model = train(256, seed=3, book=BOOK)
    net = export(model)
    env = _env(poisson(40, 60.0, MIX, (500, 5000), 8, 0.3))
    obs, _ = env.reset(seed=0)
    samples = [obs]
    while len(samples) < 20:
        obs, _, done, _, _ = env.step(fifo(env._obs, None, 0))
        samples.append(obs)
        if done:
            obs, _ = env.reset()
    env.close()
    x = torch.as_tensor(np.stack(samples))
    with torch.no_grad():
        features = model.policy.extract_features(x, model.policy.pi_features_extractor)
        want = model.policy.action_net(model.policy.mlp_extractor.forward_actor(features))
    got = np.stack([net.logits(s.astype(np.float64)) for s in samples])
    assert np.abs(got - want.numpy()).max() < 1e-5
