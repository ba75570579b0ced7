"""What-if: the policy whose plan, played forward from now in the simulator, ends best.

At a planning epoch the live state is simulated forward under each candidate (`CANDIDATES`):
four of adaptive's rules, each played without adaptive's own look-ahead (the planner's
exact simulation stands in for its fluid model, at a small part of the cost), adaptive itself
while a plan has few jobs (`PLAN_JOBS`), elastic, malleable, moldable, marble and rigid.
The simulation starts where the jobs are: a running job keeps its GPUs and the work it has
left (from the driver's expected end), so a candidate that moves it pays that move's
suspend and resume as its curve says; the waiting jobs follow in FIFO order. It uses the
curves the policy is told, not the truth, and the candidate's own code, as the daemon would
run it. The candidate with the best predicted outcome then drives every decision until
the next epoch.

* Objective. The candidates' predicted totals of completion times (J) and last ends (M),
  each over the best any candidate reaches, are weighed as J^w x M^(1-w), `w` being
  `jct_weight`: 1 weighs the mean completion time alone, 0 the makespan alone, and the
  default 0.5 both, so a large loss on one is never bought with a small gain on the other.
* Hysteresis. The driver changes only for a candidate predicted better by more than
  `min_gain` plus the error of the planner's past predictions: the gaps between each job's
  predicted end and its real one, summed, over the times that were ahead, summed. (Not a
  median of each job's own ratio: with a profile 30 % off that was 43 while the running jobs
  kept the profile's ends, so no plan changed, and it is 0 once their ends are measured,
  the waiting jobs' errors unseen; the ratio of sums gives 0.04-0.10.)
  A plan predicted alike with the driver's goes by candidate order, as any tie does.
* Epochs. A plan is made when the system holds a job the last plan did not (an arrival, or
  a job reaching the head of a long queue), at most once every `plan_every` seconds (ends
  and arrivals coalesce), and at once when the driver could never place the new job. No
  epoch while a reshape is under way (a checkpoint being written), or while a job cannot be
  simulated (no curve, or no expected end): the driver goes on.
* Bounded cost. A plan simulates the running jobs and the first `plan_jobs` waiting ones:
  a candidate count of simulations of at most that many jobs, whatever the queue holds. In
  the broker, plans are made in a process of their own (`daemon/planner.py`) and take at
  most `plan_cpu` of a core: after a plan of C CPU seconds, the next waits C / plan_cpu.

The simulator is pure too: a plan reads the state and changes nothing of it.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from functools import partial
from itertools import islice

from marbled.core.model import Job, JobState, Placement, State
from marbled.core.policy.adaptive import PLAN_JOBS, AdaptivePolicy
from marbled.core.policy.base import Option, Policy, work_left
from marbled.core.policy.phased import MAX_JOBS as PHASED_JOBS
from marbled.core.policy.phased import Phased, PhaseJob, Table, search
from marbled.core.profiles import ProfileBook, model_key


class FixedBias(AdaptivePolicy):
    """adaptive with one rule at every decision (its `CANDIDATES`' (bias, critical job
    first)), without its own look-ahead: the planner plays these variants forward exactly
    instead of adaptive's fluid model (a 25th of its cost: 1.7 s against 43.6 s for the
    simulations of 128 plans of an 8-node trace)."""

    def __init__(self, bias: float, critical: bool = False):
        super().__init__()
        self._rule = (bias, critical)

    def _candidate(self, *_) -> tuple:
        return self._rule, None

    def fresh(self) -> Policy:
        return FixedBias(*self._rule)


def _variant(bias: float, critical: bool = False) -> tuple[str, Callable[[], Policy]]:
    return f"adaptive(bias {bias:g}{', critical first' if critical else ''})", \
        partial(FixedBias, bias, critical)


def _policy(name: str) -> Policy:
    from marbled.core.policy import get_policy  # the registry imports this module

    return get_policy(name)


# (name shown, a fresh policy): the plans the planner weighs, in the order that breaks a tie
# (an idle cluster makes them all alike; the first is adaptive's rule when it does not look
# ahead). Four of adaptive's seven rules, which cost most of a plan; timeslice is left out:
# never within 10 % of the best makespan on the tuning seeds, and its many reshapes made
# its simulations the dearest.
CANDIDATES: tuple[tuple[str, Callable[[], Policy]], ...] = (
    _variant(1.0), _variant(1.0, critical=True), _variant(0.0), _variant(-1.0),
    *((name, partial(_policy, name)) for name in ("malleable", "elastic", "marble", "moldable",
                                                   "rigid")))
FIRST = "adaptive"  # drives until a plan is made (with its own look-ahead)
PHASED = Phased.name  # a plan searched over every schedule of a few jobs (`phased.py`)
ORDER = {name: i for i, name in enumerate((FIRST, *(c for c, _ in CANDIDATES), PHASED))}
POLL_S = 0.5  # how soon to look again for a plan made in the background
ERRORS_KEPT = 64  # the past predictions whose error is the hysteresis


@dataclass(frozen=True)
class Plan:
    """A planning epoch's outcome: who drives, and what each candidate was predicted to do."""

    at: float
    driver: str
    predicted: dict[str, tuple[float, float]]  # candidate -> (mean completion, last end), s
    threshold: float  # the gain a change needed


class WhatIfPolicy(Policy):
    name = "whatif"
    summary = ("simulates every policy forward from the live state and follows the one "
               "predicted best for the objective")
    reshapes = True
    multi_node = True
    overtaking = "the policy the planner follows lets it (`marble explain` names it)"
    options = (
        Option("jct_weight", 0.5, "the objective: 1 weighs the mean completion time alone, "
                                  "0 the makespan alone, between both", maximum=1.0),
        Option("plan_every", 1800.0, "seconds at least between two plans (the plan "
                                     "adopted decides meanwhile; lower it for short jobs)"),
        Option("plan_jobs", 48.0, "waiting jobs a plan simulates (the FIFO's first ones)",
               minimum=1.0),
        Option("min_gain", 0.0, "the relative gain below which the planner keeps the "
                                "plan it follows, besides the measured error of "
                                "its predictions"),
        Option("plan_cpu", 0.5, "in the broker, the share of a core its plans may take: "
                                "after a plan of C CPU seconds, the next waits C / this",
               positive=True, maximum=1.0),
    )
    jct_weight: float
    plan_every: float
    plan_jobs: float
    min_gain: float
    plan_cpu: float

    def __init__(self, **settings: float | None):
        super().__init__(**settings)
        self._policies = {name: make() for name, make in (*CANDIDATES,
                                                           (FIRST, partial(_policy, FIRST)))}
        self.driver = FIRST
        self.plan: Plan | None = None
        self._known: set[int] = set()  # the jobs the last plan simulated
        self._expected: dict[int, tuple[float, float]] = {}  # job -> (plan time, end)
        self._errors: deque[tuple[float, float]] = deque(maxlen=ERRORS_KEPT)  # (gap, ahead)
        self._due: float | None = None  # when a plan waits to be made (spacing)
        # With an executor (the daemon's: a process beside the broker), plans are made there
        # and adopted at the first decision after they are ready; decisions never wait.
        self.background: Executor | None = None
        self._pending: Future | None = None
        self._rest_until = -math.inf  # no plan before then (`plan_cpu`)
        self.plans = 0  # plans adopted
        self.cpu_s = 0.0  # CPU seconds they took

    # -- deciding

    def choose(self, state: State, now: float) -> list:
        if self._pending is not None and self._pending.done():
            made, self._pending = self._pending.result(), None
            self._adopt(made)
            # its CPU share: the next plan rests for the time this one took over that share
            self._rest_until = now + made.cpu_s / self.plan_cpu
        self._score(state, now)
        if self._wants_plan(state, now):
            self._due = now if self.plan is None else max(now, self.plan.at + self.plan_every,
                                                          self._rest_until)
        if self._due is not None and (now >= self._due or self._cannot_place(state, now)):
            self._make_plan(state, now)
        return self._policies[self.driver].choose(state, now)

    def next_decision(self, state: State, now: float) -> float | None:
        own = self._policies[self.driver].next_decision(state, now)
        due = self._due if self._due is not None and self._due > now else None
        if self._pending is not None:  # adopt a plan made beside the decisions soon after
            due = now + POLL_S
        return min((t for t in (own, due) if t is not None), default=None)

    def explain(self, job: Job, state: State, now: float) -> str:
        return self._policies[self.driver].explain(job, state, now)

    def fresh(self) -> Policy:
        """The plan it follows: a forecast plays that forward, not a planner's own plans."""
        return self._policies[self.driver].fresh()

    def plan_line(self) -> str:
        if self.plan is None:
            return f"the planner follows {self.driver} until it can simulate the jobs"
        p = self.plan.predicted
        mine, rank = p.get(self.driver), self._rank(p)
        rival = min((c for c in p if c != self.driver), default=None, key=rank.get)
        if mine is None or rival is None:
            return f"the planner follows {self.driver}'s plan"
        return (f"the planner follows {self.driver}'s plan: predicted mean JCT "
                f"{_ks(mine[0])} and last end {_ks(mine[1])} from now, against "
                f"{_ks(p[rival][0])} and {_ks(p[rival][1])} for {rival}'s")

    # -- planning

    def _wants_plan(self, state: State, now: float) -> bool:
        if self._due is not None:
            return False
        ahead = islice(state.waiting(), int(self.plan_jobs))
        return any(j.id not in self._known for j in (*state.engaged(), *ahead))

    def _cannot_place(self, state: State, now: float) -> bool:
        driver = self._policies[self.driver]
        # a phased plan never places a job it was not made for
        unknown = driver.jobs if isinstance(driver, Phased) else None
        return any(driver.feasible(j, state) or (unknown is not None and j.id not in unknown)
                   for j in islice(state.waiting(), int(self.plan_jobs)))

    def _make_plan(self, state: State, now: float) -> None:
        if self._pending is not None:
            return  # one plan at a time: the next is made once this one is adopted
        setup = _forward(state, now, int(self.plan_jobs), self.jct_weight)
        if setup is None:
            return  # not now: a reshape is under way, or a job cannot be simulated
        self._due = None
        self._known = set(setup.ids)
        if self.background is None:
            self._adopt(predict(setup))
        else:
            self._pending = self.background.submit(predict, setup)

    def _adopt(self, prediction: Prediction) -> None:
        self.cpu_s += prediction.cpu_s
        self.plans += 1
        predicted = prediction.predicted
        if not predicted:
            return
        rank = self._rank(predicted)
        order = {c: (round(rank[c], 9), ORDER.get(c, len(ORDER))) for c in rank}
        best = min(rank, key=order.get)
        if best == PHASED:  # its counts are this plan's: it drives as planned from now
            self._policies[PHASED] = Phased(prediction.table)
        threshold = self.min_gain + self.error()
        # a change for a predicted gain above the threshold; and a tie goes by candidate
        # order here too (a plan predicted alike costs nothing to change)
        if self.plan is None or self.driver not in rank or \
                rank[self.driver] > math.log1p(threshold) or \
                order[self.driver][0] == order[best][0]:
            self.driver = best
        at = prediction.at
        self.plan = Plan(at, self.driver, predicted, threshold)
        self._expected = {j: (at, at + end) for j, end in prediction.ends[self.driver].items()}

    def _rank(self, predicted: dict[str, tuple[float, float]]) -> dict[str, float]:
        """log(J^w M^(1-w)) over the best J and M: 0 for a candidate best on both."""
        jct = min(j for j, _ in predicted.values()) or 1e-9
        span = min(m for _, m in predicted.values()) or 1e-9
        w = self.jct_weight
        return {c: w * math.log(max(j, 1e-9) / jct) + (1 - w) * math.log(max(m, 1e-9) / span)
                for c, (j, m) in predicted.items()}

    def error(self) -> float:
        """The relative error of the predictions scored: |real end - predicted end| summed
        over the jobs, over the time that was ahead of them summed (0 before any)."""
        return sum(g for g, _ in self._errors) / max(sum(a for _, a in self._errors), 1.0)

    def _score(self, state: State, now: float) -> None:
        """The error of each prediction of the plan that drives, as its job ends."""
        for job_id, (at, end) in list(self._expected.items()):
            outcome = state.outcome(job_id)
            if outcome is None or outcome.finished:
                del self._expected[job_id]
                if outcome is JobState.DONE:
                    self._errors.append((abs(now - end), max(end - at, 0.0)))


@dataclass(frozen=True)
class Forward:
    """A simulation that starts from the live state at `at` (job i + 1 is `ids[i]`)."""

    at: float
    arrivals: list
    running: dict
    ids: list[int]
    book: ProfileBook
    nodes: int
    jct_weight: float = 0.5  # the objective, for the phased plan's search


@dataclass(frozen=True)
class Prediction:
    at: float
    predicted: dict[str, tuple[float, float]]  # candidate -> (mean completion, last end)
    ends: dict[str, dict[int, float]]  # candidate -> {job: its end, s after `at`}
    cpu_s: float  # what the simulations took
    table: Table | None = None  # the phased plan's counts (by job id), if one was searched


def predict(setup: Forward) -> Prediction:
    """Every candidate played forward from the same start (a pure function: the daemon runs
    it in a process of its own)."""
    from marbled.sim.engine import Simulator, WorkloadError  # it imports the policies

    started = time.process_time()
    predicted, ends = {}, {}
    # adaptive itself, its look-ahead and all, where that look-ahead is affordable: a few jobs
    small = ((FIRST, partial(_policy, FIRST)),) if len(setup.ids) <= PLAN_JOBS else ()

    def play(name: str, policy: Policy) -> None:
        try:
            r = Simulator(setup.book, policy,
                          setup.book.gpus_per_node, setup.nodes).run(setup.arrivals,
                                                                     setup.running)
        except (WorkloadError, RuntimeError):
            return  # a candidate that cannot place these jobs (or runs away)
        done = [r.jobs[i].completion for i in range(1, len(setup.ids) + 1)]
        predicted[name] = (sum(done) / len(done), max(done))
        ends[name] = dict(zip(setup.ids, done, strict=True))

    for name, make in (*small, *CANDIDATES):
        play(name, make())
    # the phased plan nearest the best the others reach on both figures, played as they are
    table = _phased_table(setup, predicted)  # by the simulation's job numbers (1, 2, ...)
    if table:
        play(PHASED, Phased(table))
    live = {frozenset(setup.ids[i - 1] for i in left): {setup.ids[i - 1]: k
                                                        for i, k in counts.items()}
            for left, counts in table.items()} if table else None
    return Prediction(setup.at, predicted, ends, time.process_time() - started, live)


def _phased_table(setup: Forward, predicted: dict[str, tuple[float, float]]) -> Table:
    """The phased plan of a simulation of a few malleable single-node jobs on one node,
    none waiting for another ({} for any other), against the best of `predicted`."""
    if setup.nodes != 1 or not 0 < len(setup.ids) <= PHASED_JOBS or any(
            a.spec.gpus is not None or a.spec.nodes != 1 or a.spec.nodes_min or a.spec.after
            for a in setup.arrivals) or any(
            u.placement.share != 1 for u in setup.running.values()):
        return {}
    jobs = [PhaseJob(i, setup.book.lookup(a.spec.model), float(a.spec.steps),
                     len(setup.running[i].placement.gpus) if i in setup.running else 0)
            for i, a in enumerate(setup.arrivals, start=1)]
    reference = (min(j for j, _ in predicted.values()),
                 min(m for _, m in predicted.values())) if predicted else None
    return search(jobs, setup.book.gpus_per_node, setup.jct_weight, reference)


def _ks(seconds: float) -> str:
    return f"{seconds / 1000:.1f} ks" if seconds >= 1000 else f"{seconds:.0f} s"


def _forward(state: State, now: float, waiting: int,
             jct_weight: float = 0.5) -> Forward | None:
    """The simulation that starts from `state` at `now`, with the running jobs and the first
    `waiting` waiting ones; None where it cannot be made."""
    from marbled.core.spec import JobSpec
    from marbled.sim.engine import Underway
    from marbled.sim.workloads import Arrival

    sizes = {len(n.gpus) for n in state.nodes.values()}
    if len(sizes) != 1 or state.unavailable or state.resumable():
        return None  # the simulator models nodes of one size, all of them taking runs
    engaged = state.engaged()
    if any(j.state is not JobState.RUNNING for j in engaged):
        return None  # a checkpoint is being written: plan on what it leaves
    ids: list[int] = []
    # not the jobs these nodes can never hold (no candidate could place them: no plan at all)
    fits = (j for j in state.waiting() if state.misfit_of(j.id) is None)
    for job in sorted([*engaged, *islice(fits, waiting)], key=lambda j: j.id):
        # not a job that waits for one beyond the plan (deps are earlier jobs, so kept first)
        if all(a in ids or state.outcome(a) is JobState.DONE for a in job.after):
            ids.append(job.id)
    if not ids:
        return None
    position = {job_id: i for i, job_id in enumerate(ids, start=1)}
    names = {n: f"node{i}" for i, n in enumerate(state.nodes)}
    slot = {n: {g: k for k, g in enumerate(node.gpus)} for n, node in state.nodes.items()}
    curves, arrivals, running = {}, [], {}
    submitted = -math.inf  # the policies read when jobs came (adaptive: does the queue grow)
    for job_id in ids:
        job = state.jobs[job_id]
        if job.curve is None:
            return None
        started = min(job.run_started - now, 0.0) if job.run_started is not None else 0.0
        trains = started + (job.curve.startup_s or 0.0)  # its first step (a run's)
        work = work_left(job, now + max(trains, 0.0))  # from its expected end: after start-up
        if work is None:
            return None
        key = model_key(f"job{job.id}")
        curves[key] = job.curve
        # in FIFO order, so the simulator's order by submission is the state's
        submitted = max(submitted, min(job.submitted - now, 0.0) if job.submitted is not None
                        else 0.0)
        arrivals.append(Arrival(submitted, JobSpec(
            emulate=True, model=key, steps=max(math.ceil(work), 1),
            gpus=None if job.malleable else job.demand, nodes=job.nodes,
            nodes_min=job.nodes_min, after=tuple(position[a] for a in job.after
                                                 if a in position))))
        if job.placement is not None:
            p = job.placement
            moved = Placement(names[p.node], tuple(slot[p.node][g] for g in p.gpus),
                              tuple((names[n], tuple(slot[n][g] for g in gs))
                                    for n, gs in p.others), p.share)
            running[position[job_id]] = Underway(moved, job.role, started, trains)
    return Forward(now, arrivals, running, ids, ProfileBook("what-if", sizes.pop(), curves),
                   len(state.nodes), jct_weight)


__all__ = ["CANDIDATES", "Plan", "WhatIfPolicy"]
