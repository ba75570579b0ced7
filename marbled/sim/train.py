"""Train the learned policy: MaskablePPO on generated workloads, exported for numpy.

    .venv/bin/python -m marbled.sim.train [--steps 120000] [--seed 0] [--out DIR]

Needs the `rl` extra (gymnasium, stable-baselines3, sb3-contrib, torch). Writes
`learned.npz` (the policy network's weights, for `--policy learned`) and `learned.json`
(how it was trained: seed, steps, workloads, wall time, library versions) to `--out`
(default: the package's `marbled/weights/`, what ships).

Why MaskablePPO over DQN (SCHED² used DQN): most actions are invalid at most decisions
(an empty window slot, a job that does not fit), and MaskablePPO takes the mask into its
distribution, so the agent never spends samples on them; DQN would need a penalty or a
masked argmax bolted on, and a replay buffer. PPO is also on-policy and cheap per step
on a CPU, and its policy head is a plain MLP that exports as a few matrices.

The episodes are drawn from the profile's curves: `EPISODE_JOBS` jobs of its models
arriving as a Poisson process, on 1, 2 or 4 nodes, at a load, step range and share of
rigid jobs drawn per episode (`draw_workload`). The seeds are drawn from `--seed`, so
the evaluation workloads of `benchmarks/policy_matrix.py` (seeds 0-2 and fixed job sets)
are not among them. With one torch thread and a fixed seed the run is reproducible.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time
from importlib.metadata import version
from pathlib import Path

PROFILE = "summit-v100"
MODELS = ("resnet-50", "inception-v3", "resnet-101", "vgg-16", "alexnet", "lenet")
EPISODE_JOBS = 60
NODES = (1, 2, 4)
JOBS_PER_HOUR_PER_NODE = (5.0, 40.0)  # the load's range, drawn per episode
STEP_RANGES = ((500, 5000), (200, 20000))
RIGID_SHARES = (0.0, 0.3)
NET = (64, 64)
ROLLOUT = 1024  # environment steps between two updates
OUT = Path(__file__).resolve().parents[1] / "weights"


def draw_workload(rng: random.Random):
    """(arrivals, nodes) of one training episode."""
    from marbled.sim.workloads import poisson

    nodes = rng.choice(NODES)
    rate = rng.uniform(*JOBS_PER_HOUR_PER_NODE) * nodes
    arrivals = poisson(EPISODE_JOBS, rate, dict.fromkeys(MODELS, 1.0),
                       rng.choice(STEP_RANGES), rng.randrange(2 ** 31),
                       rng.choice(RIGID_SHARES))
    return arrivals, nodes


def export(model):
    """The policy head of a trained MaskablePPO as a numpy `Network`."""
    import torch

    from marbled.core.policy.learned import Network

    layers = [m for m in model.policy.mlp_extractor.policy_net if isinstance(m, torch.nn.Linear)]
    layers.append(model.policy.action_net)
    return Network(tuple(m.weight.detach().double().numpy().T.copy() for m in layers),
                   tuple(m.bias.detach().double().numpy().copy() for m in layers))


def train(steps: int, seed: int, book=None, minutes: float | None = None):
    """A MaskablePPO model trained `steps` environment steps from `seed`, or fewer if
    `minutes` of wall time run out first: then it is the model of its last whole rollout,
    which `train(model.trained_steps, seed)` gives again, weight for weight."""
    import torch
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.callbacks import BaseCallback

    class Deadline(BaseCallback):
        def _on_step(self) -> bool:
            return minutes is None or time.perf_counter() - t0 < 60 * minutes

    from marbled.resources import load_profile
    from marbled.sim.env import SchedulingEnv

    torch.set_num_threads(1)
    book = book or load_profile(PROFILE)
    env = SchedulingEnv(book, draw_workload, gpus_per_node=book.gpus_per_node)
    model = MaskablePPO("MlpPolicy", env, seed=seed, n_steps=ROLLOUT, batch_size=128,
                        n_epochs=5, learning_rate=3e-4, gamma=0.99, ent_coef=0.01,
                        policy_kwargs={"net_arch": list(NET)}, device="cpu", verbose=0)
    t0 = time.perf_counter()
    model.learn(total_timesteps=steps, callback=Deadline())
    model.trained_steps = min(steps, model.num_timesteps // ROLLOUT * ROLLOUT)
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=120_000, help="environment steps")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--minutes", type=float, help="stop after the rollout running then "
                    "(the record gives the steps that reproduce the result)")
    ap.add_argument("--out", type=Path, default=OUT, help="directory for learned.npz/.json")
    args = ap.parse_args()
    t0 = time.perf_counter()
    model = train(args.steps, args.seed, minutes=args.minutes)
    wall = time.perf_counter() - t0
    steps = model.trained_steps
    args.out.mkdir(parents=True, exist_ok=True)
    export(model).save(args.out / "learned.npz")
    record = {
        "algorithm": "MaskablePPO (sb3-contrib), MlpPolicy", "net_arch": list(NET),
        "activation": "tanh", "seed": args.seed, "steps": steps, "wall_s": round(wall),
        "hyperparameters": {"n_steps": ROLLOUT, "batch_size": 128, "n_epochs": 5,
                            "learning_rate": 3e-4, "gamma": 0.99, "ent_coef": 0.01},
        "reward": "effectiveness (SCHED²'s E per job started)", "max_overtaken": 10,
        "workloads": {"profile": PROFILE, "models": MODELS, "jobs_per_episode": EPISODE_JOBS,
                      "nodes": NODES, "jobs_per_hour_per_node": JOBS_PER_HOUR_PER_NODE,
                      "step_ranges": STEP_RANGES, "rigid_shares": RIGID_SHARES,
                      "arrivals": "Poisson, seeds drawn from --seed"},
        "machine": {"cpus": "torch.set_num_threads(1)", "python": platform.python_version()},
        "versions": {p: version(p) for p in ("gymnasium", "stable-baselines3", "sb3-contrib",
                                             "torch", "numpy")},
        "command": f"python -m marbled.sim.train --steps {steps} --seed {args.seed}",
    }
    (args.out / "learned.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"trained {steps} steps in {wall:.0f} s; wrote {args.out / 'learned.npz'}")


if __name__ == "__main__":
    main()
