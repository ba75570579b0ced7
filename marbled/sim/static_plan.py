"""The best static plan: the GPU counts a user could pick by hand (`gpus: K` on each job),
searched over every assignment of a small job set, the jobs run in FIFO order as `rigid`
runs them. The yardstick of issue 21: a policy should never be behind such a plan.

Plans are ranked by a closed form of `rigid`'s schedule (strict FIFO: a job starts at the
first moment, no earlier than the job before it, when a node has its count free; nothing
is ever suspended), about 50 times faster than a simulation; the best plan's
figures are then those of the simulator itself (`Simulator` with `rigid`), so what is
reported is what `marble simulate` gives for that plan. Exhaustive up to `bound` plans,
beyond it a local search (one or two jobs' counts changed at a time) from the profile
optima and from every uniform count, with seeded kicks while its budget lasts.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from marbled.core.policy import get_policy
from marbled.core.profiles import ProfileBook
from marbled.sim.engine import SimResult, Simulator, _cost
from marbled.sim.workloads import Arrival

EXHAUSTIVE_PLANS = 6 ** 5  # a paper job set of 5 jobs on 6 GPUs, every count
LOCAL_PLANS = 20_000  # plans a local search may try: about 2 s for 50 jobs
MAX_JOBS = 50  # a static plan of a small job set, not a cluster's history


class PlanError(ValueError):
    """A workload the search cannot plan; the message says what to change."""


@dataclass(frozen=True)
class StaticJob:
    """What the search needs of a job: when it arrives and how long it runs (launch cost
    included) on each count it may run on."""

    at: float
    seconds: dict[int, float]  # GPU count -> run time


@dataclass(frozen=True)
class Plan:
    counts: tuple[int, ...]  # GPUs per job, in FIFO order
    makespan: float
    average_jct: float


@dataclass(frozen=True)
class Search:
    best: Plan
    method: str  # 'exhaustive' or 'local'
    plans_tried: int
    plans_in_space: int
    seconds: float
    note: str | None = None  # why the search is not exhaustive

    def summary(self, results: Sequence[SimResult] = ()) -> dict:
        """The plan, how it was found, and each policy's ratio to it (< 1: better)."""
        return {"counts": list(self.best.counts), "makespan_s": self.best.makespan,
                "average_jct_s": self.best.average_jct, "search": self.method,
                "plans_tried": self.plans_tried, "plans_in_space": self.plans_in_space,
                "search_s": self.seconds, "note": self.note,
                "policies": [{"policy": r.policy, **self.ratios(r)} for r in results]}

    def ratios(self, result: SimResult) -> dict:
        return {"makespan_ratio": _ratio(result.makespan, self.best.makespan),
                "average_jct_ratio": _ratio(result.average_jct, self.best.average_jct)}


def _ratio(x: float, plan: float) -> float:
    return x / plan if plan else 1.0


def plan_table(found: Search, results: Sequence[SimResult]) -> str:
    """The best static plan and every policy beside it, as `marble simulate` prints it."""
    how = (f"exhaustive over {found.plans_tried} plans" if found.method == "exhaustive" else
           f"local search, {found.plans_tried} of {found.plans_in_space} plans tried")
    lines = [f"\nbest static plan ({how}, {found.seconds * 1e3:.0f} ms): GPUs per job in FIFO "
             f"order {', '.join(map(str, found.best.counts))}",
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


def fifo_plan(jobs: Sequence[StaticJob], counts: Sequence[int], gpus_per_node: int,
              nodes: int = 1) -> tuple[float, float]:
    """(makespan, average JCT) of `counts` run as `rigid` runs explicit counts: in order,
    each job at the first event time >= its arrival and the previous job's start at which
    the first node (in node order) with `count` free GPUs has them."""
    free = [gpus_per_node] * nodes
    running: list[tuple[float, int, int]] = []  # (end, node, gpus), a heap
    last_start, total_jct, makespan = 0.0, 0.0, 0.0
    for job, k in zip(jobs, counts, strict=True):
        t = max(last_start, job.at)
        _release(running, free, t)
        node = next((n for n in range(nodes) if free[n] >= k), None)
        while node is None:  # strict FIFO: wait for the next end (ends at one instant together)
            t = running[0][0]
            _release(running, free, t)
            node = next((n for n in range(nodes) if free[n] >= k), None)
        end = t + job.seconds[k]
        free[node] -= k
        heapq.heappush(running, (end, node, k))
        last_start = t
        total_jct += end - job.at
        makespan = max(makespan, end)
    return makespan, total_jct / len(jobs) if jobs else 0.0


def _release(running: list[tuple[float, int, int]], free: list[int], t: float) -> None:
    """Every run that ends by `t` gives its GPUs back."""
    while running and running[0][0] <= t:
        _, n, g = heapq.heappop(running)
        free[n] += g


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


def search(jobs: Sequence[StaticJob], gpus_per_node: int, nodes: int = 1, *,
           bound: int = EXHAUSTIVE_PLANS, budget: int | None = None,
           starts: Sequence[Sequence[int]] = ()) -> Search:
    """The plan of least makespan, ties by average JCT (then the smaller counts first):
    every plan when there are at most `bound`, else a local search of at most `budget`
    plans from `starts` and from every uniform count (a count a job cannot run on is
    replaced by its nearest)."""
    t0 = time.perf_counter()
    budget = LOCAL_PLANS if budget is None else budget
    options = [sorted(j.seconds) for j in jobs]
    space = math.prod(len(o) for o in options)
    tried = 0

    def more() -> bool:
        return tried < budget

    def score(counts: tuple[int, ...]) -> tuple[float, float, tuple[int, ...]]:
        nonlocal tried
        tried += 1
        return (*fifo_plan(jobs, counts, gpus_per_node, nodes), counts)

    if space <= bound:
        best = min(score(c) for c in itertools.product(*options))
        method, note = "exhaustive", None
    else:
        method = "local"
        note = (f"{space} plans is more than the exhaustive bound of {bound}: a local "
                "search (one or two jobs' counts changed at a time, from the profile optima "
                "and every uniform count, then from the best plan kicked) found this plan")
        seeds = {tuple(_nearest(o, c) for o, c in zip(options, s, strict=True)) for s in starts}
        seeds |= {tuple(_nearest(o, k) for o in options) for k in range(1, gpus_per_node + 1)}
        best = min(_descend(score(s), options, score, more) for s in sorted(seeds))
        # Makespan is a maximum: one job's change rarely moves it, so descent stops on
        # plateaus. Kick the best plan (a few jobs' counts redrawn) and descend again, while
        # the budget lasts; seeded, so a job set always gets the same plan.
        rng = random.Random(0)
        while more():
            kicked = list(best[2])
            for i in rng.sample(range(len(options)), min(3, len(options))):
                kicked[i] = rng.choice(options[i])
            best = min(best, _descend(score(tuple(kicked)), options, score, more))
    makespan, jct, counts = best
    return Search(Plan(counts, makespan, jct), method, tried, space,
                  time.perf_counter() - t0, note)


def _nearest(options: list[int], count: int) -> int:
    return min(options, key=lambda k: (abs(k - count), k))


def _descend(best, options, score, more):
    """Change one job's count at a time, else two jobs' at once, while that improves the
    plan (two at once: the job that ends last often gains only if another gives up GPUs)
    and `more()` plans may be tried."""
    n = len(options)
    while True:
        for moves in (((i,) for i in range(n)), itertools.combinations(range(n), 2)):
            better = None
            for jobs in moves:
                for ks in itertools.product(*(options[i] for i in jobs)):
                    counts = list(best[2])
                    for i, k in zip(jobs, ks, strict=True):
                        counts[i] = k
                    if tuple(counts) == best[2]:
                        continue
                    if not more():
                        return best
                    trial = score(tuple(counts))
                    if trial < best:
                        best = better = trial
            if better:
                break
        else:
            return best


def best_static(book: ProfileBook, arrivals: Sequence[Arrival], gpus_per_node: int,
                nodes: int = 1, launch_s: float | None = None, suspend_s: float | None = None,
                *, bound: int = EXHAUSTIVE_PLANS) -> Search:
    """The best static plan of a job set, its figures from the simulator (`rigid`, each job
    given its count): what `marble simulate --best-static` prints."""
    ordered = sorted(arrivals, key=lambda a: a.at)
    jobs = static_jobs(book, ordered, gpus_per_node, launch_s)
    optima = [book.lookup(a.spec.model).optimal_gpus(gpus_per_node) or 1 for a in ordered]
    found = search(jobs, gpus_per_node, nodes, bound=bound, starts=[optima])
    planned = [replace(a, spec=replace(a.spec, gpus=k))
               for a, k in zip(ordered, found.best.counts, strict=True)]
    sim = Simulator(book, get_policy("rigid"), gpus_per_node, nodes, launch_s, suspend_s) \
        .run(planned)
    return replace(found, best=Plan(found.best.counts, sim.makespan, sim.average_jct))
