"""What a learned policy sees and may do: each allowed move of the state, as a row (pure, numpy).

SCHED² (Luan et al.) gives its agent the state and lets it pick a waiting job, a packing
rule placing it. Here the agent also picks the job's GPU count, and may grow, shrink or
stop a running job: the moves the what-if planner and adaptive make, so that it can
learn from them (`marbled.sim.imitate`). `observe()` lists the moves of one decision
with fixed shapes, for the Gymnasium environment (`marbled.sim.env`) and for `--policy
learned` alike, so both decide on the same numbers. Every entry lies in [-1, 1]; a time
t enters as t / (t + 1 h), so a minute is 0.016, an hour 0.5, a day 0.96.

The actions (`ACTIONS` = 209), each a row of the observation:

* start the i-th of the first `WINDOW` = 8 ready jobs (FIFO order) on c = 1..8 GPUs
  (index i x 8 + c - 1), on the node with the fewest free GPUs that hold c (SCHED²'s
  packing; the first such node on a tie): allowed for a count its curve allows, from its
  fewest up to its demand (a rigid job: its count alone);
* move the r-th of up to `RUNNING` = 16 running resizable jobs (those that train: their
  launch cost has passed; and whose run has lasted `guard` times what a move costs it;
  most time left first) to c GPUs (index 64 + r x 9 + c): on
  its node, or where that lacks room, on the fullest node that holds c; c = 0 stops it
  back to the queue. A move is a checkpoint, then a resume;
* `NOTHING` (208): take no more action now. Refused while a start is allowed and a
  node is idle (unless a move is under way: its plan is being carried out), or nothing
  holds GPUs: the policy never leaves a node idle that a job could use.

The vector (`DIM` = 10 + 209 x 17): first `GLOBAL` entries of the whole state (the share
of GPUs free, the nodes / 8, the ready jobs n / (n + 10), their mean wait, run time and
demand over the GPUs (the first 32), the running jobs over the GPUs, their mean time left,
the share of GPUs held below a job's demand, the largest free block / 8), then one row of
`ROW` entries per action, zeros where it is not allowed: allowed; start, move, nothing;
the count / 8; the count is the job's demand; its speed on the count over its best; its
time to the end on the count (with a move's cost); that time's change against its demand
(a start) or its current count (a move); its wait; its place in the window (a start) or
its current count / 8 (a move); later jobs that went before it / the bound (a start) or
"to another node" (a move); the free GPUs of the node before and after (a move's own
GPUs counted free on its node); its demand / 8; rigid; and whether the prior policy's
decision on the same state makes this move (`PRIOR`; "nothing" is marked where it makes
none of these moves; see `core/policy/learned.py`). A network scores each row alike (one
small MLP over the global entries and the row), so what it learns of one slot holds for
every slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import islice

import numpy as np

from marbled.core.model import Action, Job, JobState, Placement, Start, State, Suspend
from marbled.core.policy.base import fifo_candidates, reshape_cost, role_for, work_left
from marbled.core.profiles import ThroughputCurve

COUNTS = 8  # GPU counts 1..8 a start or a move may take
WINDOW = 8  # the waiting jobs the agent may start
RUNNING = 16  # the running jobs it may move
RESIZE = WINDOW * COUNTS  # the first move action
NOTHING = RESIZE + RUNNING * (COUNTS + 1)  # "no more action now"
ACTIONS = NOTHING + 1
GLOBAL = 10
ROW = 17
PRIOR = ROW - 1  # a row's last entry: the prior policy's decision makes this move
DIM = GLOBAL + ACTIONS * ROW
BEHIND = 32  # ready jobs the global statistics read, at most
HOUR = 3600.0


def squash(seconds: float) -> float:
    """A duration into [0, 1): half at one hour."""
    return seconds / (seconds + HOUR) if seconds > 0 else 0.0


def run_time(job: Job, count: int | None = None) -> float | None:
    """Seconds `job` trains on `count` GPUs (default: its demand), its launch cost
    included; None if unknown."""
    curve, count = job.curve, count or job.demand
    if curve is None or job.steps_left is None or not curve.possible(count):
        return None
    return job.steps_left / curve.throughput(count) + (curve.startup_s or 0.0)


@lru_cache(maxsize=4096)
def _speeds(curve: ThroughputCurve | None, demand: int) -> tuple[float, ...]:
    """Its speed on 1..COUNTS GPUs over the best of them and its demand (0: cannot run)."""
    if curve is None or not curve.possible(demand):
        return tuple(min(c, demand) / demand for c in range(1, COUNTS + 1))
    raw = [curve.throughput(c) if curve.possible(c) else 0.0 for c in range(1, COUNTS + 1)]
    best = max(*raw, curve.throughput(demand))
    return tuple(s / best for s in raw)


def counts(job: Job) -> tuple[int, ...]:
    """The GPU counts a start may give it: its fewest up to its demand that its curve
    allows; a rigid job its count alone."""
    if not job.malleable or job.demand > COUNTS:
        return (job.demand,) if job.demand <= COUNTS else ()
    curve = job.curve
    return tuple(c for c in range(job.fewest, job.demand + 1)
                 if curve is None or curve.possible(c))


def pack(count: int, free: dict[str, list[int]]) -> str | None:
    """SCHED²'s packing: the node with the fewest free GPUs that still hold `count`."""
    best = None
    for n, gpus in free.items():
        if len(gpus) >= count and (best is None or len(gpus) < len(free[best])):
            best = n
    return best


@dataclass(frozen=True)
class Observation:
    vector: np.ndarray  # float32, shape (DIM,)
    mask: np.ndarray  # bool, shape (ACTIONS,): the actions allowed; the last is NOTHING
    jobs: tuple[Job, ...]  # the window, in FIFO order
    running: tuple[Job, ...]  # the movable running jobs, in their slots
    moves: dict[int, Action]  # what each allowed action does (NOTHING: absent)

    @property
    def rows(self) -> np.ndarray:
        """The action rows of the vector, (ACTIONS, ROW): a view, not a copy."""
        return self.vector[GLOBAL:].reshape(ACTIONS, ROW)

    def index(self, action: Action) -> int | None:
        """The action of this observation that does what `action` (another policy's) does:
        the same job started on as many GPUs, or moved to as many (on another node too);
        None where none does (another policy's Start of a job outside the window, on
        several nodes or a shared GPU, a move of a job outside the slots)."""
        if isinstance(action, Start):
            if action.others or action.share > 1:
                return None
            slot = next((i for i, j in enumerate(self.jobs) if j.id == action.job), None)
            if slot is None:
                return None
            i = slot * COUNTS + len(action.gpus) - 1
        elif isinstance(action, Suspend):
            slot = next((r for r, j in enumerate(self.running) if j.id == action.job), None)
            if slot is None or (action.resume_on and action.resume_on.others):
                return None
            count = len(action.resume_on.gpus) if action.resume_on else 0
            i = RESIZE + slot * (COUNTS + 1) + count
        else:
            return None
        return i if 0 <= i < NOTHING and self.mask[i] else None


def observe(state: State, now: float, bound: float, guard: float = 0.0,
            prior: Sequence[Action] = ()) -> Observation:
    """The agent's view of `state` at `now`. `bound`: a job lets at most that many later
    jobs start before it; once it has, only it may start (FIFO from there on). `guard`: a
    run may be moved once it has lasted that many times what a move costs it. `prior`: the
    prior policy's actions on the same state; the rows that make one are marked (`PRIOR`),
    "nothing" where none is a move of this view."""
    free = {n: state.free(n) for n in state.nodes}
    total = sum(n.size for n in state.nodes.values()) or 1
    vec = np.zeros(DIM, dtype=np.float32)
    rows = vec[GLOBAL:].reshape(ACTIONS, ROW)
    mask = np.zeros(ACTIONS, dtype=bool)
    moves: dict[int, Action] = {}

    ready = fifo_candidates(state, now)
    jobs = tuple(islice(ready, WINDOW))
    forced = bool(jobs) and state.overtaken(jobs[0].id) >= bound
    for i, job in enumerate(jobs[:1] if forced else jobs):
        if job.nodes > 1:
            continue
        speeds, wait = _speeds(job.curve, job.demand), _wait(job, now)
        best = run_time(job)
        passed = min(state.overtaken(job.id) / bound, 1.0) if bound > 0 else 1.0
        for c in counts(job):
            node = pack(c, free)
            if node is None:
                continue
            a = i * COUNTS + c - 1
            run = run_time(job, c)
            mask[a] = True
            rows[a, :PRIOR] = (1.0, 1.0, 0.0, 0.0, c / COUNTS, float(c == job.demand),
                               speeds[c - 1], _time(run), _time(run) - _time(best), wait,
                               i / WINDOW, passed, len(free[node]) / COUNTS,
                               (len(free[node]) - c) / COUNTS, min(job.demand / COUNTS, 1.0),
                               float(not job.malleable))
            moves[a] = Start(job.id, node, tuple(free[node][:c]), role_for(job, c))

    engaged = state.engaged()
    movable = sorted((j for j in engaged if _movable(j, now, guard)),
                     key=lambda j: (-(j.expected_end or 0.0), j.id))[:RUNNING]
    for r, job in enumerate(movable):
        node, held = job.placement.node, len(job.gpus)
        speeds, left = _speeds(job.curve, job.demand), work_left(job, now)
        now_end = _time(left / job.curve.throughput(held) if left is not None else None)
        cost = reshape_cost(job)
        for c in (0, *counts(job)):
            # on its node, or where its node lacks room, to the fullest node that holds c
            to = node if c - held <= len(free[node]) else pack(c, free)
            if c == held or to is None:
                continue
            a = RESIZE + r * (COUNTS + 1) + c
            end = 1.0 if c == 0 else _time(left / job.curve.throughput(c) + cost
                                           if left is not None else None)
            room = len(free[to]) + (held if to == node else 0)  # its own GPUs included
            mask[a] = True
            rows[a, :PRIOR] = (1.0, 0.0, 1.0, 0.0, c / COUNTS, float(c == job.demand),
                               speeds[c - 1] if c else 0.0, end, end - now_end,
                               _wait(job, now), held / COUNTS, float(to != node),
                               len(free[to]) / COUNTS, (room - c) / COUNTS,
                               min(job.demand / COUNTS, 1.0), 0.0)
            if c == 0:
                moves[a] = Suspend(job.id, None, "learned: back to the queue")
                continue
            if to != node:
                gpus = tuple(free[to][:c])
            elif c < held:
                gpus = job.gpus[:c]
            else:
                gpus = tuple(sorted(job.gpus + tuple(free[node][:c - held])))
            why = f"learned: {'grow' if c > held else 'shrink'} to {c}"
            moves[a] = Suspend(job.id, Placement(to, gpus),
                               why + (f" on {to}" if to != node else ""))

    starts = mask[:RESIZE].any()
    idle = any(len(free[n]) == state.nodes[n].size > 0 for n in free)
    # a reshape under way is a plan being carried out: its GPUs are spoken for
    moving = any(j.state is JobState.SUSPENDING for j in engaged)
    mask[NOTHING] = not starts or (bool(engaged) and (moving or not idle))
    if mask[NOTHING]:
        rows[NOTHING, :4] = (1.0, 0.0, 0.0, 1.0)

    rest = list(islice(ready, BEHIND))
    window = [*jobs, *rest][:BEHIND]
    if window:
        count = max(state.ready_count, len(window))
        runs = [run_time(j) for j in window]
        vec[2:6] = (count / (count + 10), sum(_wait(j, now) for j in window) / len(window),
                    sum(_time(r) for r in runs) / len(runs),
                    min(sum(j.demand * j.nodes for j in window) / total, 1.0))
    running = [j for j in engaged if j.placement is not None]
    held = sum(len(j.gpus) for j in running)
    below = sum(len(j.gpus) for j in running if len(j.gpus) < j.demand)
    vec[0] = sum(len(g) for g in free.values()) / total
    vec[1] = min(len(state.nodes) / COUNTS, 1.0)
    vec[6] = min(len(running) / total, 1.0)
    if running:
        vec[7] = sum(_time(None if j.expected_end is None else j.expected_end - now)
                     for j in running) / len(running)
    vec[8] = below / held if held else 0.0
    vec[9] = min(max((len(g) for g in free.values()), default=0) / COUNTS, 1.0)
    obs = Observation(vec, mask, jobs, tuple(movable), moves)
    marked = [i for a in prior if (i := obs.index(a)) is not None] or [NOTHING]
    rows[marked, PRIOR] = mask[marked]
    return obs


def _movable(job: Job, now: float, guard: float) -> bool:
    """May the agent move this job now: a resizable run on whole GPUs of one node, with a
    curve, that trains (its launch cost has passed: the drivers refuse to stop a run still
    starting up, lifecycle I6) and has lasted `guard` times what a move costs it."""
    p, started = job.placement, job.run_started
    if not (job.state is JobState.RUNNING and job.malleable and job.curve is not None
            and p is not None and not p.others and p.share == 1 and job.nodes == 1
            and started is not None and now > started):
        return False
    return now - started >= max(job.curve.startup_s or 0.0, guard * reshape_cost(job))


def _time(seconds: float | None) -> float:
    """A time to an end: squashed; 0.5 (an hour) when unknown."""
    return 0.5 if seconds is None else squash(max(seconds, 0.0))


def _wait(job: Job, now: float) -> float:
    return squash(now - job.submitted) if job.submitted is not None else 0.0
