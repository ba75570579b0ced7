"""The policy base: what a policy declares, and the mechanism every policy shares.

A policy is one class in one module. It declares its `name`, a one-line
`summary`, its `options` (both CLIs build their flags from them), and what it
can do (`multi_node`: places jobs that ask for several nodes; `promotes`: resumes
secondaries on more GPUs, so the daemon may prestart them). It implements
`choose()`; `decide()` around it does what every policy needs the same way:

* a job suspended with GPUs reserved for its resume (a promotion, a resize)
  starts on them;
* a waiting job whose dependency failed or was cancelled is cancelled.

`feasible()` says why a job can never run under the policy (the daemon refuses it
at submission); `explain()` says in one line why a job is where it is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import ClassVar

from marbled.core.model import (
    Action,
    Cancel,
    Job,
    JobState,
    Role,
    Start,
    State,
    dependency_status,
)
from marbled.core.shapes import UNFIT_WAIT, shapes
from marbled.core.target import gpus_text

BROKEN = "a job it depends on failed or was cancelled"


@dataclass(frozen=True)
class Option:
    """A number that tunes a policy; the CLIs offer it as `--name-with-dashes`."""

    name: str  # a Python identifier: the keyword of the policy's constructor
    default: float
    help: str
    minimum: float = 0.0
    positive: bool = False  # the minimum itself is not allowed
    maximum: float | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


class Policy:
    name: ClassVar[str]
    summary: ClassVar[str]  # one line: what it does, for --help
    options: ClassVar[tuple[Option, ...]] = ()
    multi_node: ClassVar[bool] = False  # places jobs that ask for several nodes
    promotes: ClassVar[bool] = False  # resumes running secondaries on more GPUs
    shrinks: ClassVar[bool] = False  # moves a running job above its demand down to it
    reshapes: ClassVar[bool] = False  # resizes (or stops) running jobs as the load changes
    # The rule that lets a later job start before a waiting one, in `explain`'s words
    overtaking: ClassVar[str] = ("jobs start in FIFO order among those the free GPUs fit, "
                                 "and they fitted when it did not (or it waited for a "
                                 "dependency or a back-off)")

    def __init__(self, **settings: float | None):
        known = {o.name: o for o in self.options}
        unknown = sorted(set(settings) - set(known))
        if unknown:
            raise ValueError(f"policy {self.name} has no option {unknown[0]}; "
                             f"its options: {', '.join(known) or 'none'}")
        for option in self.options:
            value = settings.get(option.name)
            value = option.default if value is None else float(value)
            if value < option.minimum or (option.positive and value == option.minimum):
                bound = "greater than" if option.positive else "at least"
                raise ValueError(f"{option.flag} must be {bound} {option.minimum:g}")
            if option.maximum is not None and value > option.maximum:
                raise ValueError(f"{option.flag} must be at most {option.maximum:g}")
            setattr(self, option.name, value)

    def decide(self, state: State, now: float = 0.0) -> list[Action]:
        """The actions to take at `now`. Pure: reads `state`, never changes it."""
        actions: list[Action] = [
            Start(j.id, j.resume_on.node, j.resume_on.gpus, role_for(j, len(j.resume_on.gpus)))
            for j in state.resumable()]
        actions += [Cancel(i, BROKEN) for i in state.broken()]
        return actions + self.choose(state, now)

    def choose(self, state: State, now: float) -> list[Action]:
        """The policy's own actions; resumes and cancels are already decided."""
        raise NotImplementedError

    def next_decision(self, state: State, now: float) -> float | None:
        """When the policy wants to decide again with no event (None: only on events).

        Drivers ask after each decision and decide again at that time unless an event
        comes first; a time at or before `now` asks for a decision at every poll."""
        return None

    def feasible(self, job: Job, state: State) -> tuple[str, str] | None:
        """Why `job` can never run under this policy on these nodes, as (the field of its
        request at fault, what to change); None if it can."""
        if job.nodes > 1 and not self.multi_node:
            from marbled.core.policy import POLICIES  # the registry imports every policy

            able = [n for n, p in sorted(POLICIES.items()) if p.multi_node]
            return "nodes", (f"policy {self.name} runs single-node jobs only; use --policy "
                             f"{', '.join(able[:-1])} or {able[-1]}")
        return None

    def shrinks_now(self, job: Job, now: float) -> bool:
        """Would this policy's next decision move running `job` down to its demand? The
        rule its decisions use (`shrinks` policies), so that `explain` says what it does."""
        return False

    def fresh(self) -> Policy:
        """A new policy that decides as this one does from here on, with nothing of what
        this one has seen (the forecast plays it forward): its class with its settings."""
        return type(self)(**{o.name: getattr(self, o.name) for o in self.options})

    def plan_line(self) -> str | None:
        """Which plan drives the decisions, and why, for `marble explain` (a planner's, such
        as whatif's); None for a policy that decides alone."""
        return None

    def explain(self, job: Job, state: State, now: float) -> str:
        """Why `job` is where it is, in one line."""
        if job.state.finished:
            return f"{job.state.value}"
        target = job.resume_on and f"{gpus_text(len(job.resume_on.gpus))} of {job.resume_on.node}"
        if job.state is JobState.SUSPENDING:
            return "is writing its checkpoint" + (f", to resume on {target}" if target else
                                                  " to be suspended")
        if target:
            return f"resumes on {target}, reserved for it"
        if job.placement is not None:
            role = role_now(job, state, self.promotes).value
            count = gpus_text(len(job.gpus)) if job.placement.share == 1 else \
                f"1/{job.placement.share} of 1 GPU"
            if job.nodes > 1:
                where = ", ".join(n for n, _ in job.placement.parts())
                return f"runs as {role} on {count} of each of {where}"
            which = "its demand" if len(job.gpus) == job.demand else f"its demand is {job.demand}"
            return f"runs as {role} on {count} of {job.placement.node} ({which})"
        return self.why_waiting(job, state, now)

    def why_waiting(self, job: Job, state: State, now: float) -> str:
        unfit = state.misfit_of(job.id)
        if unfit:
            return f"cannot run in this allocation: {unfit}; {UNFIT_WAIT}"
        if job.not_before is not None and job.not_before > now:
            return f"waits out its retry back-off ({job.not_before - now:.0f} s left)"
        status = dependency_status(job, state)
        if status == "broken":
            return f"will be cancelled: {BROKEN}"
        if status == "wait":
            open_ = [(d, s) for d in job.after if (s := state.outcome(d)) is not JobState.DONE]
            return "waits for " + ", ".join(f"job {d} ({s.value})" for d, s in open_)
        ahead = 0
        for other in fifo_candidates(state, now):
            if other.id == job.id:
                break
            ahead += 1
        if ahead:
            return f"waits in the FIFO behind {ahead} eligible job(s)"
        most = max((len(state.free(n)) for n in state.nodes), default=0)
        where = f"{gpus_text(job.demand)} on each of {job.nodes} nodes" if job.nodes > 1 else \
            f"{gpus_text(job.demand)} on one node"
        if job.nodes_min is not None:
            where = " or ".join(f"{gpus_text(per)} on each of {k} nodes" if k > 1 else
                                f"{gpus_text(per)} on one node"
                                for k, per in shapes(job.demand, job.nodes, job.nodes_min))
        return f"is next in the FIFO and needs {where}; the most free on a node is {most}"


def fifo_candidates(state: State, now: float = 0.0) -> Iterator[Job]:
    """Waiting jobs in FIFO order whose dependencies are met.

    Jobs still waiting for a dependency are skipped, as the paper schedules "the
    next job which is marked as independent"; so are jobs that wait out a retry
    back-off (until `not_before`), without holding up the queue, and jobs whose
    dependency can never be met (`decide()` cancels them). The state keeps the ready
    jobs apart (`State.ready()`): jobs held by their dependencies cost nothing here.
    """
    for job in state.ready():
        if job.not_before is not None and job.not_before > now:
            continue
        yield job


def take_nodes(free: dict[str, list[int]], count: int,
               want: Callable[[str], int]) -> list[tuple[str, tuple[int, ...]]] | None:
    """`want(node)` of the lowest free GPUs on each of the first `count` nodes that have
    them, taken out of `free`; None (and `free` untouched) if fewer nodes have them.

    A node left with no free GPU is dropped from `free` (`want` is at least 1, so it could
    never be chosen again): a decision that starts one job after another on many nodes
    no longer reads every full node again for each job."""
    chosen = []
    for n, gpus in free.items():
        k = want(n)
        if len(gpus) >= k:
            chosen.append((n, k))
            if len(chosen) == count:
                break
    else:
        return None
    parts = []
    for n, k in chosen:
        gpus = free[n]
        parts.append((n, tuple(gpus[:k])))
        if len(gpus) > k:
            free[n] = gpus[k:]
        else:
            del free[n]
    return parts


def role_for(job: Job, gpus: int, share: int = 1) -> Role:
    """PRIMARY on the job's whole demand, else SECONDARY; a job on several nodes runs only
    as a primary (a node range's run on fewer nodes has more GPUs on each)."""
    return Role.PRIMARY if share == 1 and (gpus == job.demand or job.nodes > 1) \
        else Role.SECONDARY


def role_now(job: Job, state: State, promotes: bool = False) -> Role | None:
    """The role a job plays now, the one `marble status`, `show`, `explain` and the dashboard
    show (None without a run). The primary is the job that gets its count; secondaries run
    on what is left beside others. A run's role is its policy's at its start (`role_for`):
    since then its neighbours may have ended, or its count (`demand`) been lowered to what it
    holds. So a run on whole GPUs is the primary if it holds its count (or more), or runs
    alone (no other job holds or reserves GPUs), as a job that a policy sized by the load
    does; except, under a policy that `promotes` its secondaries, a secondary alone below its
    count: the policy moves it up to its count as soon as that pays."""
    if job.role is not Role.SECONDARY or job.placement is None or job.placement.share != 1:
        return job.role
    if len(job.gpus) >= job.demand:
        return Role.PRIMARY
    alone = all(other.id == job.id for other in state.engaged())
    return Role.PRIMARY if alone and not promotes else Role.SECONDARY


def resizing(jobs: list[Job]) -> bool:
    """Is one of these jobs still checkpointing for a suspend (its GPUs not yet free)?"""
    return any(j.state is JobState.SUSPENDING for j in jobs)


def work_left(job: Job, now: float) -> float | None:
    """Steps `job` still has to train: from the driver's estimate of its run's end while it
    runs, else from its last count; None if unknown."""
    if job.curve is None:
        return None
    if job.placement is not None:
        if job.expected_end is None:
            return None
        return max(job.expected_end - now, 0.0) * job.curve.throughput(
            len(job.gpus), job.placement.share)
    return job.steps_left


def reshape_cost(job: Job) -> float:
    """Seconds a suspend and a resume take the job (its curve's, else nothing known)."""
    curve = job.curve
    return ((curve.startup_s or 0.0) + (curve.suspend_s or 0.0)) if curve else 0.0


def reshape_pays(job: Job, count: int, now: float, margin: float = 0.0) -> bool | None:
    """Would moving running `job` to `count` GPUs end it sooner, by more than `margin` times
    the move's cost? None when its curve or its work left is unknown."""
    work = work_left(job, now)
    if work is None:
        return None
    cost = reshape_cost(job)
    before = work / job.curve.throughput(len(job.gpus))
    after = work / job.curve.throughput(count) + cost
    return before - after > margin * cost


def settled(job: Job, now: float) -> bool:
    """Has the job's run lasted longer than a reshape costs it? A run that has barely begun
    is not moved again (with no event in between, a policy would reshape forever): with no
    cost, not at the instant it started."""
    return job.run_started is not None and now > job.run_started \
        and now - job.run_started >= reshape_cost(job)


def start_on(job: Job, parts: list[tuple[str, tuple[int, ...]]], role: Role) -> Start:
    (node, gpus), *others = parts
    return Start(job.id, node, gpus, role, tuple(others))
