"""Static plans: a fixed GPU count per job, the jobs run in FIFO order as `rigid` runs
them (strict FIFO: a job starts at the first moment, no earlier than the job before it,
when a node has its count free; nothing is ever suspended), and the search for the best
one. Pure: `marbled.sim.static_plan` builds the jobs of a job set and simulates the plan
found; the adaptive policy searches the plans of the jobs it knows (its look-ahead).

The closed form `fifo_plan` is about 50 times faster than a simulation. The search is
exhaustive up to `bound` plans, beyond it a local search (one or two jobs' counts changed
at a time) from given starts and from every uniform count, with seeded kicks while its
budget lasts.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

EXHAUSTIVE_PLANS = 6 ** 5  # a paper job set of 5 jobs on 6 GPUs, every count
LOCAL_PLANS = 20_000  # plans a local search may try: about 2 s for 50 jobs
# What a plan is the best for: its makespan (ties by average JCT), or its average JCT (ties
# by makespan). The best plan for one can be far from the best for the other (issue 33: one
# short and one long job of one model on 6 GPUs, side by side: mean 500 s, end 500 s; one
# after the other on all six: mean 341 s, end 568 s).
OBJECTIVES = ("makespan", "jct")


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
    objective: str = "makespan"  # what the plan is the best for (OBJECTIVES)

    def summary(self, results: Sequence = ()) -> dict:
        """The plan, how it was found, and each policy's ratio to it (< 1: better); a result
        is anything with `policy`, `makespan` and `average_jct` (a `SimResult`)."""
        return {"objective": self.objective, "counts": list(self.best.counts),
                "makespan_s": self.best.makespan,
                "average_jct_s": self.best.average_jct, "search": self.method,
                "plans_tried": self.plans_tried, "plans_in_space": self.plans_in_space,
                "search_s": self.seconds, "note": self.note,
                "policies": [{"policy": r.policy, **self.ratios(r)} for r in results]}

    def ratios(self, result) -> dict:
        return {"makespan_ratio": _ratio(result.makespan, self.best.makespan),
                "average_jct_ratio": _ratio(result.average_jct, self.best.average_jct)}


def _ratio(x: float, plan: float) -> float:
    return x / plan if plan else 1.0


def fifo_plan(jobs: Sequence[StaticJob], counts: Sequence[int],
              gpus_per_node: int | Sequence[int], nodes: int = 1) -> tuple[float, float]:
    """(makespan, average JCT) of `counts` run as `rigid` runs explicit counts: in order,
    each job at the first event time >= its arrival and the previous job's start at which
    the first node (in node order) with `count` free GPUs has them."""
    free = _room(gpus_per_node, nodes)
    order = range(len(free))
    running: list[tuple[float, int, int]] = []  # (end, node, gpus), a heap
    push, pop = heapq.heappush, heapq.heappop  # the search calls this for every plan
    last_start, total_jct, makespan = 0.0, 0.0, 0.0
    for job, k in zip(jobs, counts, strict=True):
        t = job.at if job.at > last_start else last_start
        while True:
            while running and running[0][0] <= t:  # every run that ends by t frees its GPUs
                _, n, g = pop(running)
                free[n] += g
            node = next((n for n in order if free[n] >= k), None) if len(free) > 1 else \
                (0 if free[0] >= k else None)
            if node is not None:
                break
            if not running:
                raise ValueError(f"a job of {k} GPUs fits no node of {_room(gpus_per_node, nodes)}"
                                 ": give counts no larger than a node")
            t = running[0][0]  # strict FIFO: wait for the next end (ends at one instant together)
        end = t + job.seconds[k]
        free[node] -= k
        push(running, (end, node, k))
        last_start = t
        total_jct += end - job.at
        if end > makespan:
            makespan = end
    return makespan, total_jct / len(jobs) if jobs else 0.0


def _room(gpus_per_node: int | Sequence[int], nodes: int) -> list[int]:
    """The GPUs of each node: `nodes` alike, or as listed (nodes that differ)."""
    return [gpus_per_node] * nodes if isinstance(gpus_per_node, int) else list(gpus_per_node)


def search(jobs: Sequence[StaticJob], gpus_per_node: int | Sequence[int], nodes: int = 1, *,
           bound: int = EXHAUSTIVE_PLANS, budget: int | None = None,
           starts: Sequence[Sequence[int]] = (), objective: str = "makespan") -> Search:
    """The plan of least makespan, ties by average JCT (`objective` "jct": of least average
    JCT, ties by makespan; then the smaller counts first): every plan when there are at
    most `bound`, else a local search of at most `budget` plans from `starts` and from
    every uniform count (a count a job cannot run on is replaced by its nearest)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective: one of {', '.join(OBJECTIVES)}, not {objective!r}")
    by_makespan = objective == "makespan"
    t0 = time.perf_counter()
    budget = LOCAL_PLANS if budget is None else budget
    room = _room(gpus_per_node, nodes)
    options = [sorted(j.seconds) for j in jobs]
    space = math.prod(len(o) for o in options)
    tried = 0

    def more() -> bool:
        return tried < budget

    def score(counts: tuple[int, ...]) -> tuple[float, float, tuple[int, ...]]:
        nonlocal tried
        tried += 1
        makespan, jct = fifo_plan(jobs, counts, room)
        return (makespan, jct, counts) if by_makespan else (jct, makespan, counts)

    if space <= bound:
        best = min(score(c) for c in itertools.product(*options))
        method, note = "exhaustive", None
    else:
        method = "local"
        note = (f"{space} plans is more than the exhaustive bound of {bound}: a local "
                "search (one or two jobs' counts changed at a time, from the profile optima "
                "and every uniform count, then from the best plan kicked) found this plan")
        seeds = {tuple(_nearest(o, c) for o, c in zip(options, s, strict=True)) for s in starts}
        seeds |= {tuple(_nearest(o, k) for o in options) for k in range(1, max(room) + 1)}
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
    first, second, counts = best
    makespan, jct = (first, second) if by_makespan else (second, first)
    return Search(Plan(counts, makespan, jct), method, tried, space,
                  time.perf_counter() - t0, note, objective)


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
