"""Train the learned policy: imitate the what-if planner, DAgger, MaskablePPO; export for numpy.

    .venv/bin/python -m marbled.sim.train [--episodes 160] [--dagger 3] [--ppo-steps 30000]
        [--teacher whatif] [--validate 24] [--ship best] [--prior-weight 3] [--seed 0]
        [--processes 2] [--out DIR]

Needs the `rl` extra (gymnasium, stable-baselines3, sb3-contrib, torch). Three stages,
each of whose networks is written (`learned-bc.npz`, `learned-dagger.npz`,
`learned-ppo.npz`), so each stage's worth can be measured alone:

1. **Behaviour cloning.** `--episodes` workloads are run under the teacher (`--teacher`,
   default whatif); each decision is labelled with the teacher's moves at that instant
   (`marbled.sim.imitate`); the scorer learns them (`marbled.sim.scorer.fit`: minus the
   log-probability of those moves together, among the allowed ones).
2. **DAgger** (`--dagger` rounds): as many episodes again, each move the teacher's with
   probability 0.5^round, else the student's; the teacher labels the states the student
   reaches, the labels join the others, and the scorer learns them all again.
3. **MaskablePPO** (`--ppo-steps`, 0 to skip): the scorer, as the actor of sb3-contrib's
   MaskablePPO (a critic beside it), fine-tuned on SCHED²'s effectiveness reward in
   `marbled.sim.env`. MaskablePPO rather than DQN: at most decisions most actions are
   invalid, and it puts the mask into its distribution.

The prior (`core/policy/learned.py`, elastic) marks its moves in the rows of every
observation; the DAgger students and the validation pick with `--prior-weight` added to
those moves' logits, as the policy does; MaskablePPO fine-tunes the network alone.

`learned.npz` is the stage `--ship` names, by default the best on `--validate` episodes of
their own (the geometric mean of its average JCT and makespan over the teacher's);
`learned.json` says how it was trained (seeds, stages, losses, validation, wall time,
library versions, the command).

The episodes are the families the policy is judged on (`marbled.sim.generators`):
production-shaped traces (6-GPU nodes, 40 jobs a node), the multi-node family's long jobs
and job sets submitted together (4-GPU nodes), 1-8 nodes, launch and suspend 10 s each.
Their seeds are drawn from `--seed` above `SEED_FLOOR`, so `benchmarks/policy_matrix.py`'s
tuning, held-out and fresh seeds are never among them. With one torch thread and a fixed
seed the run is reproducible.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
from importlib.metadata import version
from pathlib import Path

from marbled.core.policy.learned import PRIOR, PRIOR_WEIGHT

PROFILE = "summit-v100"
FAMILIES = {"production": 0.5, "long": 0.3, "together": 0.2}  # the episodes' mix
NODES = (1, 2, 4, 8)
LOADS = (0.5, 0.95)  # production: the offered load's range
PER_NODE_HOUR = (0.15, 0.45)  # long jobs: arrivals an hour a node
SEED_FLOOR = 1_000_000  # training seeds lie above every seed the benchmarks use
COSTS = (10.0, 10.0)  # launch, suspend
HIDDEN = (64, 64)
BC_EPOCHS, DAGGER_EPOCHS = 30, 15
OUT = Path(__file__).resolve().parents[1] / "weights"
STAGES = ("bc", "dagger", "ppo")


def draw_workload(rng: random.Random, book=None) -> tuple[str, list, int, int]:
    """(name, arrivals, nodes, GPUs per node) of one training episode."""
    from marbled.resources import load_profile
    from marbled.sim.generators import MULTI_MODELS, long_jobs, production, together

    book = book or load_profile(PROFILE)
    family = rng.choices(list(FAMILIES), list(FAMILIES.values()))[0]
    seed = SEED_FLOOR + rng.randrange(2 ** 30)
    if family == "together":
        jobs = rng.randint(3, 8)
        return f"together-{jobs}-s{seed}", together(seed, book=book, jobs=jobs,
                                                     models=MULTI_MODELS), 1, 4
    nodes = rng.choice(NODES)
    if family == "long":
        rate = rng.uniform(*PER_NODE_HOUR)
        return f"long-n{nodes}-r{rate:.2f}-s{seed}", long_jobs(
            seed, book=book, nodes=nodes, per_node_hour=rate, models=MULTI_MODELS), nodes, 4
    load = rng.uniform(*LOADS)
    return f"prod-n{nodes}-l{load:.2f}-s{seed}", production(
        seed, book=book, nodes=nodes, gpus_per_node=book.gpus_per_node, load=load), \
        nodes, book.gpus_per_node


def imitate(episodes: int, rounds: int, seed: int, teacher: str, processes: int,
            prior_weight: float, log=print):
    """Behaviour cloning, then `rounds` of DAgger: the torch scorer after each, with the
    figures of each stage."""
    import torch

    from marbled.sim import imitate as im
    from marbled.sim import scorer as sc

    torch.manual_seed(seed)
    rng = random.Random(seed)
    mlp = sc.scorer_module(HIDDEN)
    stages, data = [], []
    for k in range(rounds + 1):
        eps = [draw_workload(rng) for _ in range(episodes)]
        student = None if k == 0 else sc.export(mlp)
        t0 = time.perf_counter()
        samples, outcomes = im.collect(eps, teacher, student, 0.5 ** k, seed * 1000 + k,
                                       PROFILE, COSTS, processes, prior_weight)
        collect_s = time.perf_counter() - t0
        before = im.agreement(student, samples) if student is not None else None
        data.append(samples)
        t0 = time.perf_counter()
        losses = sc.fit(mlp, im.Samples.join(data), epochs=BC_EPOCHS if k == 0 else
                        DAGGER_EPOCHS, seed=seed * 1000 + k)
        fit_s = time.perf_counter() - t0
        labelled = len(samples)
        unlabelled = sum(o["unlabelled"] for o in outcomes)
        stage = {"round": k, "beta": 0.5 ** k, "episodes": episodes, "labels": labelled,
                 "unlabelled": unlabelled, "collect_s": round(collect_s, 1),
                 "fit_s": round(fit_s, 1), "loss_first": round(losses[0], 4),
                 "loss_last": round(losses[-1], 4),
                 "student_agreement_before": None if before is None else round(before, 3)}
        stages.append(stage)
        log(f"round {k} (beta {0.5 ** k:g}): {labelled} labels ({unlabelled} unlabelled) in "
            f"{collect_s:.0f} s; loss {losses[0]:.3f} -> {losses[-1]:.3f} in {fit_s:.0f} s"
            + (f"; the student agreed with the teacher on {before:.1%} of its own states"
               if before is not None else ""))
        if k == 0:
            bc = sc.export(mlp)
    return bc, sc.export(mlp), mlp, stages


def fine_tune(mlp, steps: int, seed: int, log=print):
    """MaskablePPO from the scorer `mlp` (the actor; a critic beside it) on the
    effectiveness reward: the fine-tuned scorer."""
    from sb3_contrib import MaskablePPO

    from marbled.resources import load_profile
    from marbled.sim.env import SchedulingEnv
    from marbled.sim.scorer import ScorerPolicy

    book = load_profile(PROFILE)
    rng = random.Random(seed)

    def workload(_):
        _, arrivals, nodes, gpus = draw_workload(rng, book)
        return arrivals, nodes, gpus

    env = SchedulingEnv(book, workload, gpus_per_node=book.gpus_per_node,
                        launch_s=COSTS[0], suspend_s=COSTS[1])
    model = MaskablePPO(ScorerPolicy, env, seed=seed, n_steps=1024, batch_size=128,
                        n_epochs=4, learning_rate=1e-4, gamma=0.99, ent_coef=0.0,
                        clip_range=0.1, policy_kwargs={"hidden": HIDDEN}, device="cpu",
                        verbose=0)
    model.policy.mlp_extractor.actor.load_state_dict(mlp.state_dict())
    t0 = time.perf_counter()
    model.learn(total_timesteps=steps)
    log(f"ppo: {steps} steps in {time.perf_counter() - t0:.0f} s")
    env.close()
    return model.policy.mlp_extractor.actor


def validate(nets: dict, episodes: int, seed: int, teacher: str, processes: int,
             prior_weight: float, log=print) -> dict[str, float]:
    """Each stage's network on `episodes` episodes of their own (drawn from `seed` + 1, so
    apart from the training's): the geometric mean over them of its average JCT and
    makespan, each over the teacher's."""
    import math
    from multiprocessing import get_context

    rng = random.Random(seed + 1)
    eps = [draw_workload(rng) for _ in range(episodes)]
    runs = [(k, name) for k in range(episodes) for name in (teacher, *nets)]
    with get_context("spawn").Pool(processes) as pool:  # as `imitate.collect`'s
        done = dict(zip(runs, pool.map(_outcome, [(eps[k], name, nets.get(name), prior_weight)
                                                  for k, name in runs], chunksize=1),
                        strict=True))
    score = {}
    for name in nets:
        logs = [math.log(done[k, name][i] / done[k, teacher][i])
                for k in range(episodes) for i in (0, 1)]
        score[name] = math.exp(sum(logs) / len(logs))
        log(f"validation: {name} {score[name]:.3f} x the teacher ({episodes} episodes)")
    return score


def _outcome(job) -> tuple[float, float]:
    from marbled.core.policy import get_policy
    from marbled.core.policy.learned import LearnedPolicy
    from marbled.resources import load_profile
    from marbled.sim.engine import Simulator

    (_, arrivals, nodes, gpus), name, net, prior_weight = job
    policy = (get_policy(name) if net is None
              else LearnedPolicy(network=net, prior_weight=prior_weight))
    r = Simulator(load_profile(PROFILE), policy, gpus, nodes, *COSTS).run(arrivals)
    return r.average_jct, r.makespan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=160, help="episodes a round (default 160)")
    ap.add_argument("--dagger", type=int, default=3, help="DAgger rounds after the cloning")
    ap.add_argument("--ppo-steps", type=int, default=30_000,
                    help="MaskablePPO steps after DAgger (0: none)")
    ap.add_argument("--teacher", default="whatif", help="the policy imitated")
    ap.add_argument("--ship", choices=("best", *STAGES), default="best",
                    help="the stage written as learned.npz (default best: the one closest "
                         "to the teacher on the validation episodes)")
    ap.add_argument("--validate", type=int, default=24,
                    help="validation episodes, apart from the training's (default 24)")
    ap.add_argument("--prior-weight", type=float, default=PRIOR_WEIGHT,
                    help="how far the DAgger students and the validation lean on the prior's "
                         f"moves (default {PRIOR_WEIGHT:g}, the policy's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--processes", type=int, default=2, help="simulations side by side")
    ap.add_argument("--out", type=Path, default=OUT, help="directory for learned.npz/.json")
    args = ap.parse_args()
    for name, value in (("--episodes", args.episodes), ("--processes", args.processes)):
        if value < 1:
            sys.exit(f"{name} must be at least 1")
    if args.dagger < 0 or args.ppo_steps < 0 or args.validate < 0 or args.prior_weight < 0:
        sys.exit("--dagger, --ppo-steps, --validate and --prior-weight must be 0 or more")
    if args.ship == "best" and not args.validate:
        sys.exit("--ship best needs --validate above 0")
    if args.ship == "ppo" and not args.ppo_steps:
        sys.exit("--ship ppo needs --ppo-steps above 0")
    import torch

    from marbled.sim.scorer import export

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    bc, dagger, mlp, rounds = imitate(args.episodes, args.dagger, args.seed, args.teacher,
                                      args.processes, args.prior_weight)
    nets = {"bc": bc, "dagger": dagger}
    if args.ppo_steps:
        nets["ppo"] = export(fine_tune(mlp, args.ppo_steps, args.seed))
    scores = validate(nets, args.validate, args.seed, args.teacher, args.processes,
                      args.prior_weight) if args.validate else {}
    ship = min(scores, key=scores.get) if args.ship == "best" else args.ship
    wall = time.perf_counter() - t0
    args.out.mkdir(parents=True, exist_ok=True)
    for stage, net in nets.items():
        net.save(args.out / f"learned-{stage}.npz")
    nets[ship].save(args.out / "learned.npz")
    record = {
        "algorithm": "behaviour cloning and DAgger from the what-if planner, then MaskablePPO "
                     "(sb3-contrib); one scorer MLP over each move's row, the prior's moves "
                     "marked in their rows",
        "prior": PRIOR, "prior_weight": args.prior_weight,
        "shipped_stage": ship, "teacher": args.teacher,
        "validation": {"episodes": args.validate, "seeds": "drawn from --seed + 1",
                       "score": "geometric mean of avg JCT and makespan over the teacher's",
                       **{k: round(v, 4) for k, v in scores.items()}}, "hidden": list(HIDDEN),
        "activation": "tanh", "seed": args.seed, "episodes_per_round": args.episodes,
        "dagger_rounds": rounds, "epochs": {"bc": BC_EPOCHS, "dagger": DAGGER_EPOCHS},
        "ppo": {"steps": args.ppo_steps, "n_steps": 1024, "batch_size": 128, "n_epochs": 4,
                "learning_rate": 1e-4, "clip_range": 0.1, "ent_coef": 0.0,
                "reward": "effectiveness (SCHED²'s E per job started)"},
        "wall_s": round(wall), "max_overtaken": 10,
        "workloads": {"profile": PROFILE, "families": FAMILIES, "nodes": NODES,
                      "production_loads": LOADS, "long_jobs_per_node_hour": PER_NODE_HOUR,
                      "costs": COSTS, "seeds": f"drawn from --seed, above {SEED_FLOOR}"},
        "machine": {"processes": args.processes, "torch_threads": 1,
                    "python": platform.python_version()},
        "versions": {p: version(p) for p in ("gymnasium", "stable-baselines3", "sb3-contrib",
                                             "torch", "numpy")},
        "command": (f"python -m marbled.sim.train --episodes {args.episodes} --dagger "
                    f"{args.dagger} --ppo-steps {args.ppo_steps} --teacher {args.teacher} "
                    f"--ship {args.ship} --validate {args.validate} --prior-weight "
                    f"{args.prior_weight:g} --seed {args.seed}"),
    }
    (args.out / "learned.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"trained in {wall:.0f} s; wrote {args.out / 'learned.npz'} (stage {ship})")


if __name__ == "__main__":
    main()
