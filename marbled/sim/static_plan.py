"""The best static plan of a job set: the GPU counts a user could pick by hand (`gpus: K`
on each job), the jobs run in FIFO order as `rigid` runs them. The yardstick of issue 21:
a policy should never be behind such a plan.

The schedule's closed form and the search are pure (`marbled.core.static_plan`, which the
adaptive policy's look-ahead also uses); here a job set becomes the search's jobs (each
job's run time on every count its curve allows), and the best plan's figures are those of
the simulator itself (`Simulator` with `rigid`), so what is reported is what
`marble simulate` gives for that plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from marbled.core.policy import get_policy
from marbled.core.profiles import ProfileBook
from marbled.core.static_plan import EXHAUSTIVE_PLANS, Plan, Search, StaticJob, search
from marbled.sim.engine import SimResult, Simulator, _cost
from marbled.sim.workloads import Arrival

MAX_JOBS = 50  # a static plan of a small job set, not a cluster's history


class PlanError(ValueError):
    """A workload the search cannot plan; the message says what to change."""


def plan_table(found: Search, results: Sequence[SimResult]) -> str:
    """The best static plan and every policy beside it, as `marble simulate` prints it."""
    how = (f"exhaustive over {found.plans_tried} plans" if found.method == "exhaustive" else
           f"local search, {found.plans_tried} of {found.plans_in_space} plans tried")
    best_for = "makespan" if found.objective == "makespan" else "average JCT"
    lines = [f"\nbest static plan for {best_for} ({how}, {found.seconds * 1e3:.0f} ms): GPUs "
             f"per job in FIFO order {', '.join(map(str, found.best.counts))}",
             f"  makespan {found.best.makespan:.1f} s, average JCT "
             f"{found.best.average_jct:.1f} s"]
    if found.note:
        lines.append(f"  note: {found.note}")
    lines.append(f"  {'policy':<11}{'makespan / plan':>16}{'avg JCT / plan':>16}")
    for r in results:
        q = found.ratios(r)
        lines.append(f"  {r.policy:<11}{q['makespan_ratio']:>16.3f}"
                     f"{q['average_jct_ratio']:>16.3f}")
    return "\n".join(lines)


def static_jobs(book: ProfileBook, arrivals: Sequence[Arrival], gpus_per_node: int,
                launch_s: float | None = None) -> list[StaticJob]:
    """Each job's run time on every count its curve allows on a node (FIFO order)."""
    if len(arrivals) > MAX_JOBS:
        raise PlanError(f"the best static plan is searched for small job sets (at most "
                        f"{MAX_JOBS} jobs); this workload has {len(arrivals)}: give a job "
                        "set or a shorter trace")
    out = []
    for i, a in enumerate(sorted(arrivals, key=lambda a: a.at), start=1):
        where = a.where or f"job {i}"
        if a.spec.after or a.spec.nodes > 1:
            raise PlanError(f"{where}: static plans are searched for independent single-node "
                            "jobs; drop 'after' and 'nodes' from the job set")
        curve = book.lookup(a.spec.model) if a.spec.model else None
        if curve is None or a.spec.steps is None:
            raise PlanError(f"{where}: a static plan needs a profiled model and a step count "
                            f"for every job (profile '{book.system}' has "
                            f"{', '.join(book.models)})")
        startup = _cost(launch_s, curve.startup_s)
        seconds = {k: startup + a.spec.steps / curve.throughput(k)
                   for k in range(1, gpus_per_node + 1) if curve.possible(k)}
        if not seconds:
            raise PlanError(f"{where}: '{a.spec.model}' runs on no count of 1..{gpus_per_node} "
                            "GPUs in its profile")
        out.append(StaticJob(a.at, seconds))
    return out


def best_static(book: ProfileBook, arrivals: Sequence[Arrival], gpus_per_node: int,
                nodes: int = 1, launch_s: float | None = None, suspend_s: float | None = None,
                *, bound: int = EXHAUSTIVE_PLANS, objective: str = "makespan") -> Search:
    """The best static plan of a job set for `objective` ("makespan" or "jct"), its figures
    from the simulator (`rigid`, each job given its count): what `marble simulate
    --best-static` prints, for each objective."""
    ordered = sorted(arrivals, key=lambda a: a.at)
    jobs = static_jobs(book, ordered, gpus_per_node, launch_s)
    optima = [book.lookup(a.spec.model).optimal_gpus(gpus_per_node) or 1 for a in ordered]
    found = search(jobs, gpus_per_node, nodes, bound=bound, starts=[optima], objective=objective)
    planned = [replace(a, spec=replace(a.spec, gpus=k))
               for a, k in zip(ordered, found.best.counts, strict=True)]
    sim = Simulator(book, get_policy("rigid"), gpus_per_node, nodes, launch_s, suspend_s) \
        .run(planned)
    return replace(found, best=Plan(found.best.counts, sim.makespan, sim.average_jct))
