"""`marble` commands that need no broker: simulate, trace, demo."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from marbled.cli.common import json_option, output
from marbled.cli.policy_options import make_policy, policy_settings
from marbled.core.policy import POLICIES
from marbled.core.profiles import ProfileError
from marbled.core.spec import SpecError
from marbled.core.target import gpus_text
from marbled.resources import DEFAULT_PROFILE, JobFileError, load_profile, workload_path

POISSON_MODELS = "resnet-50,inception-v3,resnet-101,vgg-16"  # --poisson's default mix


@click.command()
@click.option("--policy", "policies", multiple=True, type=click.Choice(sorted(POLICIES)),
              help="Policy to simulate; repeat to compare (docs/simulator.md says what "
                   "each does). [default: every policy]")
@click.option("--workload", type=click.Path(path_type=Path, dir_okay=False),
              help="A job-set YAML (all jobs at t=0), a CSV trace (see docs/traces.md), or "
                   "a name in workloads/ such as paper-jobset3.")
@click.option("--poisson", "poisson_jobs", type=click.IntRange(1), default=None,
              help="Instead of --workload: N synthetic jobs with Poisson arrivals.")
@click.option("--production", "production_jobs", type=click.IntRange(1), default=None,
              help="Instead of --workload: N jobs shaped like a production cluster's (most "
                   "on 1 GPU, heavy-tailed durations, daily swings, sweeps; docs/simulator.md) "
                   "at --load.")
@click.option("--together", "together_jobs", type=click.IntRange(1, 50), default=None,
              help="Instead of --workload: N jobs submitted at once, 1-24 h each on one GPU.")
@click.option("--rate", type=click.FloatRange(min=1e-6), default=60.0, show_default=True,
              help="With --poisson: arrivals per hour.")
@click.option("--load", type=click.FloatRange(0.001, 2.0), default=0.95, show_default=True,
              help="With --production: the GPU-time the jobs ask for over what the nodes "
                   "give while they arrive.")
@click.option("--models", default=None,
              help="With --poisson (default resnet-50,inception-v3,resnet-101,vgg-16), "
                   "--production or --together (default: all the profile's): the models "
                   "drawn, in equal shares (comma list).")
@click.option("--steps", "step_range", default="500-5000", show_default=True,
              help="With --poisson: each job's steps, drawn uniformly from LOW-HIGH.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="With --poisson, --production or --together: the random seed (the "
                   "simulation itself is deterministic).")
@click.option("--profile", default=DEFAULT_PROFILE, show_default=True,
              help="Throughput curves: a name in profiles/ or a YAML path.")
@click.option("--nodes", type=click.IntRange(1, 100_000), default=1, show_default=True,
              help="Nodes in the simulated allocation, --gpus each.")
@click.option("--gpus", type=click.IntRange(1, 1024), default=None,
              help="GPUs per node. [default: the profile's gpus_per_node]")
@click.option("--launch-overhead", type=click.FloatRange(min=0), default=None,
              help="Seconds from a launch to the first step (import, build, restore), for "
                   "every model. [default: each model's startup_s in the profile, else 0]")
@click.option("--suspend-overhead", type=click.FloatRange(min=0), default=None,
              help="Seconds from a suspension request to the exit, for every model. "
                   "[default: each model's suspend_s in the profile, else 0]")
@policy_settings
@click.option("--best-static", is_flag=True,
              help="Also search the best static plans (a fixed GPU count per job, run in FIFO "
                   "order, as `gpus: K` on each job), one for makespan and one for average "
                   "JCT, and print each policy beside each. For small job sets: exhaustive "
                   "up to 7776 plans, a local search beyond.")
@click.option("--gantt", type=click.Path(path_type=Path, dir_okay=False),
              help="Also draw the GPUs over time into this PNG (needs matplotlib).")
@json_option
@click.pass_context
def simulate(ctx, policies, workload, poisson_jobs, production_jobs, together_jobs, rate, load,
             models, step_range, seed, profile, nodes, gpus, launch_overhead, suspend_overhead,
             best_static, gantt, as_json, **settings):
    """What would each policy do with a workload? A simulation on the profile's curves.

    Runs the same policy code as marbled on a virtual clock and prints, per
    policy: makespan, average job completion time and wait, GPU utilization,
    suspensions, the share of GPU-time lost to launch/suspend overheads, and the
    makespan against a lower bound no schedule can beat.

    \b
    Examples:
      marble simulate --workload paper-jobset3 --gantt jobset3.png
      marble simulate --poisson 1000 --rate 120 --nodes 4 --launch-overhead 5
      marble simulate --production 640 --load 0.95 --nodes 16 --seed 3
      marble simulate --together 4 --gpus 4 --best-static
      marble simulate --workload my-history.csv --nodes 8 --json
      marble simulate --workload paper-jobset3 --best-static --launch-overhead 10
    """
    from marbled.sim.engine import Simulator
    from marbled.sim.generators import production, together
    from marbled.sim.report import comparison_table, gantt_png
    from marbled.sim.static_plan import PlanError, plan_table
    from marbled.sim.static_plan import best_static as search_plan
    from marbled.sim.workloads import TraceError, from_job_file, poisson, read_trace

    given = [w for w in (workload, poisson_jobs, production_jobs, together_jobs) if w is not None]
    if len(given) != 1:
        raise click.UsageError("give one of --workload FILE, --poisson N, --production N or "
                               "--together N")
    try:
        book = load_profile(profile)
        per_node = gpus or book.gpus_per_node
        if workload is not None:
            path = workload_path(str(workload))
            arrivals = read_trace(path) if path.suffix == ".csv" else from_job_file(path)
        else:
            mix = list(dict.fromkeys(m.strip() for m in (
                models or ("" if poisson_jobs is None else POISSON_MODELS)).split(",")
                if m.strip()))
            unknown = [m for m in mix if book.lookup(m) is None]
            if (models is not None and not mix) or unknown:
                raise click.BadParameter(f"{unknown or 'none given'}; the profile has "
                                         f"{', '.join(book.models)}", param_hint="--models")
            if poisson_jobs is not None:
                arrivals = poisson(poisson_jobs, rate, dict.fromkeys(mix, 1.0),
                                   _step_range(step_range), seed)
            elif production_jobs is not None:
                arrivals = production(seed, book=book, nodes=nodes, gpus_per_node=per_node,
                                      load=load, jobs=production_jobs, models=mix or None)
            else:
                arrivals = together(seed, book=book, jobs=together_jobs, models=mix or None)
        # the plan first: a workload too large for it fails before the simulations
        plans = [search_plan(book, arrivals, per_node, nodes, launch_overhead,
                             suspend_overhead, objective=objective)
                 for objective in ("makespan", "jct")] if best_static else []
        # by default, every policy that can run the workload: a job on several nodes leaves
        # out those that place single-node jobs only (naming one gives its refusal)
        several = any(a.spec.nodes > 1 for a in arrivals)
        names = policies or [n for n in sorted(POLICIES) if POLICIES[n].multi_node or not several]
        left_out = sorted(set(POLICIES) - set(names)) if not policies else []
        results = [Simulator(book, make_policy(name, settings), per_node, nodes, launch_overhead,
                             suspend_overhead).run(arrivals)
                   for name in names]
    except (ProfileError, JobFileError, TraceError, SpecError, PlanError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    if gantt:
        gantt_png(results, gantt)

    def text() -> None:
        costs = ", ".join(f"{what} {'per model' if v is None else f'{v:g} s'}" for what, v in
                          (("launch", launch_overhead), ("suspend", suspend_overhead)))
        click.echo(f"{len(arrivals)} jobs on {nodes} node(s) x {gpus_text(per_node)}, profile "
                   f"{book.system}, overheads: {costs}")
        click.echo(comparison_table(results))
        if left_out:
            click.echo(f"left out: {', '.join(left_out)} (single-node jobs only; the "
                       "workload has a job on several nodes)")
        for plan in plans:
            click.echo(plan_table(plan, results))
        if gantt:
            click.echo(f"Gantt chart: {gantt}")

    output(ctx, as_json, {"nodes": nodes, "gpus_per_node": per_node, "profile": book.system,
                          "results": [r.summary() for r in results], "left_out": left_out,
                          "gantt": str(gantt) if gantt else None,
                          # the best plan for makespan, and the best for average JCT
                          **({"best_static": plans[0].summary(results),
                              "best_static_jct": plans[1].summary(results)} if plans else {})},
           text)


def _step_range(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    try:
        pair = int(low), int(high or low)
    except ValueError:
        pair = (0, 0)
    if not 1 <= pair[0] <= pair[1]:
        raise click.BadParameter(f"'{text}' is not LOW-HIGH with 1 <= LOW <= HIGH, e.g. "
                                 "500-5000", param_hint="--steps")
    return pair


@click.command()
@click.argument("database", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@click.option("-o", "--output", "out", type=click.Path(path_type=Path, dir_okay=False),
              required=True, help="The CSV trace to write.")
def trace(database, out):
    """Turn a broker's marble.db into a CSV trace for `marble simulate --workload`.

    One row per job with a model and a step count, at its submission time
    relative to the first; jobs without them cannot be replayed and are counted.
    """
    from marbled.sim.workloads import TraceError, trace_from_store, write_trace

    try:
        arrivals, skipped = trace_from_store(database)
        write_trace(out, arrivals, comment=f"from {database.name}")
    except (TraceError, ValueError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"wrote {len(arrivals)} jobs to {out}"
               + (f" ({skipped} without model or steps left out)" if skipped else ""))


@click.command()
@click.option("--gpus", default=6, show_default=True, help="Emulated GPUs on the node.")
@click.option("--time-scale", default=0.02, show_default=True,
              help="Real seconds per profiled second.")
@click.option("--jobset", default="paper-jobset1", show_default=True,
              help="A job-set name in workloads/ or a YAML path.")
@json_option
def demo(gpus, time_scale, jobset, as_json):
    """Run a paper job set the MARBLE way and the LSF way on emulated GPUs and compare."""
    from marbled.demo import run_demo

    sys.exit(run_demo(gpus=gpus, time_scale=time_scale, jobset=jobset, as_json=as_json))


COMMANDS = (simulate, trace, demo)
