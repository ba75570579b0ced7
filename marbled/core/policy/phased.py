"""Phased: GPU counts for a few jobs, searched over every schedule, followed phase by phase.

Each policy of the zoo makes one kind of schedule; for a handful of malleable jobs on one
node (a set submitted together, a quiet queue) the best for the objective may be none of
them: on 4-job sets the zoo's best makespan and best mean JCT often come from different
policies, each 3.5-5 % behind on the other figure, where a schedule near both exists
(docs/simulator.md says how often, with the FIFO kept and without).
`search` enumerates the schedules that change counts only when a job ends: a phase gives
each unfinished job a count (0: it waits) and lasts until the first of them ends; a job
whose count changes pays its curve's suspend and start-up (a start waits for the
suspensions of its phase). Jobs start in FIFO order, as under every policy: a phase never
starts a job while an earlier one waits. The best schedule is the one nearest, on both
figures, the best mean completion and last end that other plans reach (`search`), and
its counts, by the set of jobs left, are what `Phased` follows.

The what-if planner proposes it beside the zoo (`whatif.predict`) and plays it in the
simulator like any candidate, so it is adopted only where it is predicted best. Where the
jobs end in another order than the plan's, or a job it does not know is waiting, `Phased`
decides as malleable does until the next plan (the planner makes one at once for a job
the plan does not know).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

from marbled.core.model import Job, Start, State, Suspend
from marbled.core.policy.base import (
    Policy,
    fifo_candidates,
    reshape_cost,
    resizing,
    role_for,
    settled,
)
from marbled.core.policy.malleable import MalleableEquipartition
from marbled.core.profiles import ThroughputCurve
from marbled.core.target import gpus_text

# jobs a search takes. 4 jobs, in FIFO order: about 500 schedules on 4 GPUs (6 ms of CPU),
# 5,600 on 6 (64 ms), 33,000 on 8 (0.4 s); 3 jobs on 8 GPUs: 480 (5 ms)
MAX_JOBS = 4

Counts = dict[int, int]  # job -> GPUs, for the jobs that run in a phase
Table = dict[frozenset[int], Counts]  # the jobs left -> the counts of their phase


@dataclass(frozen=True)
class PhaseJob:
    id: int
    curve: ThroughputCurve
    work: float  # steps left
    gpus: int = 0  # the count it runs on now (0: it waits)


def search(jobs: list[PhaseJob], gpus: int, jct_weight: float,
           reference: tuple[float, float] | None = None) -> Table:
    """The counts of the best schedule of `jobs` on one node of `gpus` GPUs, by the jobs
    left at each phase; {} if there is none (no job can run on these GPUs).

    The best is the one whose larger loss against `reference` (the best mean completion and
    last end other plans reach; by default the schedules' own) is least, each loss
    weighed as the objective weighs its figure (`jct_weight` for the mean, the rest for the
    last end): a plan near both bests, not one that buys a gain on one with as large a loss
    on the other. Ties go to the better J^w x M^(1-w)."""
    found = list(_schedules(jobs, gpus))
    if not found:
        return {}
    mean0, last0 = reference or (min(m for m, _, _ in found), min(e for _, e, _ in found))
    w = jct_weight

    def rank(s: tuple[float, float, Table]) -> tuple[float, float]:
        jct = w * math.log(max(s[0], 1e-9) / max(mean0, 1e-9))
        span = (1 - w) * math.log(max(s[1], 1e-9) / max(last0, 1e-9))
        return round(max(jct, span), 9), jct + span

    return min(found, key=rank)[2]


def _schedules(jobs: list[PhaseJob], gpus: int) -> Iterator[tuple[float, float, Table]]:
    """(mean completion, last end, table) of every schedule that changes counts at ends."""
    by_id = {j.id: j for j in jobs}
    options = {j.id: [k for k in range(1, gpus + 1) if j.curve.possible(k)] for j in jobs}
    if any(not o for o in options.values()):
        return

    def phases(t: float, left: dict[int, float], now: Counts, ends: dict[int, float],
               table: Table) -> Iterator[tuple[float, float, Table]]:
        live = sorted(left)
        if not live:
            yield sum(ends.values()) / len(ends), max(ends.values()), table
            return
        most = min(gpus, sum(max(options[i]) for i in live))
        # every way to use all the GPUs it can; and the runs kept as they are (a move that
        # costs more than it gains), if that leaves some idle
        full = (dict(zip(live, c, strict=True)) for c in
                itertools.product(*([0, *options[i]] for i in live)) if sum(c) == most)
        kept = {i: now[i] for i in live if now.get(i)}
        for counts in itertools.chain(full, [kept] if 0 < sum(kept.values()) < most else []):
            given = {i: k for i, k in counts.items() if k}
            if not _in_fifo_order(live, now, given):
                continue
            wait = max((by_id[i].curve.suspend_s or 0.0 for i in live
                        if now.get(i, 0) not in (0, given.get(i, 0))), default=0.0)
            delay = {i: 0.0 if now.get(i) == k else wait + (by_id[i].curve.startup_s or 0.0)
                     for i, k in given.items()}
            speed = {i: by_id[i].curve.throughput(k) for i, k in given.items()}
            finish = {i: delay[i] + left[i] / speed[i] for i in given}
            step = min(finish.values())
            rest, done = {}, dict(ends)
            for i in live:
                trained = max(step - delay[i], 0.0) * speed[i] if i in given else 0.0
                if i in given and finish[i] <= step * (1 + 1e-12):
                    done[i] = t + finish[i]
                else:
                    rest[i] = max(left[i] - trained, 0.0)
            yield from phases(t + step, rest, given, done,
                              {**table, frozenset(live): given})

    yield from phases(0.0, {j.id: j.work for j in jobs},
                      {j.id: j.gpus for j in jobs if j.gpus}, {}, {})


def _move(gpus: int) -> str:
    return f"the phased plan gives it {gpus_text(gpus)} now" if gpus else \
        "the phased plan has it wait now"


def _in_fifo_order(live: list[int], now: Counts, given: Counts) -> bool:
    """Do the jobs a phase starts (or starts again on a new count) come, in FIFO order,
    before every job it leaves waiting? A plan keeps the FIFO as every policy does: a job
    never starts while an earlier one waits."""
    started = [i for i, k in given.items() if now.get(i) != k]
    waits = [i for i in live if i not in given]
    return not started or not waits or max(started) < min(waits)


class Phased(Policy):
    """Follows a searched plan's counts (`table`), phase by phase."""

    name = "phased"
    summary = "GPU counts searched over every schedule of a few jobs (the what-if planner's)"
    reshapes = True

    def __init__(self, table: Table):
        super().__init__()
        self.table = table
        self.jobs = frozenset().union(*table)
        self._fallback = MalleableEquipartition()
        self.following = self.name  # whose rules the last decision kept: its, or malleable's

    def fresh(self) -> Policy:
        return Phased(self.table)

    def _counts(self, state: State) -> Counts | None:
        """The counts of the phase the jobs are in; None off the plan (a job it does not
        know waits or runs, or the jobs left are not a phase of its)."""
        if len(state.nodes) != 1 or any(
                j.id not in self.jobs for j in state.engaged()) or next(
                (j for j in state.waiting() if j.id not in self.jobs), None) is not None:
            return None
        return self.table.get(self._left(state))

    def _left(self, state: State) -> frozenset[int]:
        """The plan's jobs not ended (a job gone from the broker, withdrawn, has ended)."""
        return frozenset(i for i in self.jobs
                         if (s := state.outcome(i)) is not None and not s.finished)

    def choose(self, state: State, now: float) -> list:
        engaged = state.engaged()
        if resizing(engaged):
            return []  # a reshape is under way: decide on the GPUs it leaves
        counts = self._counts(state)
        self.following = self.name if counts is not None else self._fallback.name
        if counts is None:
            return self._fallback.choose(state, now)
        moves = [Suspend(j.id, None, _move(counts.get(j.id, 0))) for j in engaged
                 if len(j.gpus) != counts.get(j.id, 0) and settled(j, now)]
        if moves or any(len(j.gpus) != counts.get(j.id, 0) for j in engaged):
            return moves  # the starts follow on the GPUs they leave
        (node,) = state.nodes
        free = sorted(state.free(node))
        starts = []
        for job in fifo_candidates(state, now):
            k = counts.get(job.id, 0)
            if k and len(free) >= k:
                starts.append(Start(job.id, node, tuple(free[:k]), role_for(job, k)))
                free = free[k:]
        return starts

    def why_waiting(self, job: Job, state: State, now: float) -> str:
        counts = self._counts(state)
        if counts is None or job.id not in self.jobs:
            return super().why_waiting(job, state, now)
        if job.id in counts:
            if any(len(j.gpus) != counts.get(j.id, 0) for j in state.engaged()):
                return (f"starts on {gpus_text(counts[job.id])}, its count in the planner's "
                        "phased plan, once the runs the plan moves have stopped")
            return super().why_waiting(job, state, now)
        left = self._left(state)
        # its phase: the soonest of the plan's later phases that gives it GPUs
        phase = max((k for k, c in self.table.items() if k < left and job.id in c),
                    key=len, default=None)
        if phase is None:
            return super().why_waiting(job, state, now)
        first = sorted(left - phase)
        ends = f"job {first[0]} ends" if len(first) == 1 else \
            f"jobs {', '.join(map(str, first))} end"
        return f"waits for its phase of the planner's phased plan: it starts once {ends}"

    def next_decision(self, state: State, now: float) -> float | None:
        counts = self._counts(state)
        if counts is None:
            return self._fallback.next_decision(state, now)
        # a run too young to move (`settled`) is moved once it has run a reshape's cost
        due = [j.run_started + reshape_cost(j) for j in state.engaged()
               if len(j.gpus) != counts.get(j.id, 0) and j.run_started is not None
               and not settled(j, now)]
        return min(due, default=None)
