"""What a learned policy sees of the state: SCHED²'s Table I with fixed shapes (pure, numpy).

SCHED² (Luan et al.) gives its agent the remaining time of every GPU, the first J
waiting jobs and statistics of the rest; it picks one of the J jobs or "nothing now",
and a packing rule places the job. `observe()` builds that view from a `State`, for
the Gymnasium environment (`marbled.sim.env`) and for `--policy learned` alike, so
both decide on the same numbers. Every entry lies in [-1, 1]; a time t enters as
t / (t + 1 h), so a minute is 0.016, an hour 0.5, a day 0.96.

The vector, in order (`DIM` = 8 x 8 + 10 x 12 + 5 = 189 entries):

* GPU state, 8 nodes x 8 GPUs: each node's GPUs by remaining time, shortest first (0:
  free, the time to the run's expected end, 1: held with no known end, -1: no such GPU).
  Nodes with the most free GPUs come first; a ninth node on is left out, and fewer
  nodes are padded with -1.
* Job state, the first `WINDOW` = 10 ready jobs in FIFO order, 12 entries each (zeros
  for an empty slot): present; it may start now (the mask); its demand / 8; its
  wait; its run time on its demand (from its steps and its curve; 1 h if unknown); its
  curve on 1, 2, 4 and 8 GPUs over the best of those and its count (SCHED²'s k = 4
  profiled placements; 0 where it cannot run; linear up to its count without a curve); the
  GPUs the packing rule leaves free on its node / 8 (-1: it cannot start); its speed on
  the GPUs it would start on over its speed on its demand; the later jobs that went
  before it / the bound.
* Statistics of the ready jobs behind the window (SCHED²'s four, the means over the
  first 32 of them): their count as n / (n + 10), mean GPU count / 8, mean run time, mean wait;
  and the share of the GPUs free.

The job's count comes from its curve, not from the action: its demand (the profile's
optimum, as `size_job` set it) where a node has it free, else as many GPUs as the
node with most free has (a resizable job, down to the fewest its curve allows). The
action space stays J + 1, as SCHED²'s; the agent does not have to learn what the
curve already says, and it still chooses between starting a job now on fewer GPUs and
holding them for later (its observation gives the speed the job would get).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice

import numpy as np

from marbled.core.model import Job, State
from marbled.core.policy.base import fifo_candidates

NODES = 8  # nodes of the GPU state
GPUS = 8  # GPU slots per node of the GPU state
WINDOW = 10  # J: the waiting jobs the agent may pick from
PROFILED = (1, 2, 4, 8)  # counts of the curve in a job's entry (SCHED²'s k = 4)
PER_JOB = 8 + len(PROFILED)
BEHIND = 32  # ready jobs behind the window the statistics read, at most
DIM = NODES * GPUS + WINDOW * PER_JOB + 5
NOTHING = WINDOW  # the action "start nothing now"
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


def pack(job: Job, free: dict[str, list[int]]) -> tuple[str, tuple[int, ...]] | None:
    """SCHED²'s packing rule for a one-node job: the node with the fewest free GPUs that
    still hold its demand (the first such node on a tie); where none does, a resizable
    job takes the node with the most free GPUs, on as many as its curve allows there
    (SCHED² spreads the rest over other servers; a job here runs on one node). Its
    lowest free GPUs; None if it cannot start."""
    if job.nodes > 1 or not free:
        return None
    fits = [(len(gpus), n) for n, gpus in free.items() if len(gpus) >= job.demand]
    if fits:
        node = min(fits, key=lambda f: f[0])[1]
        return node, tuple(free[node][:job.demand])
    node = max(free, key=lambda n: len(free[n]))
    count = job.fit(len(free[node])) if job.malleable else None
    if count is None or count < job.fewest:
        return None
    return node, tuple(free[node][:count])


@dataclass(frozen=True)
class Observation:
    vector: np.ndarray  # float32, shape (DIM,)
    mask: np.ndarray  # bool, shape (WINDOW + 1,): the actions allowed; the last is NOTHING
    jobs: tuple[Job, ...]  # the window, in FIFO order
    places: tuple[tuple[str, tuple[int, ...]] | None, ...]  # where each would start now


def observe(state: State, now: float, bound: float) -> Observation:
    """The agent's view of `state` at `now`. `bound`: a job lets at most that many later
    jobs start before it; once it has, only it may start (FIFO from there on).

    "Nothing now" is refused only when nothing holds GPUs and a job may start: an idle
    cluster with a job that fits starts it (no event would come to decide again)."""
    free = {n: state.free(n) for n in state.nodes}
    vec = np.zeros(DIM, dtype=np.float32)
    vec[:NODES * GPUS] = -1.0
    left = {}  # (node, gpu) -> remaining seconds (inf: no known end)
    engaged = state.engaged()
    for job in engaged:
        for p in (job.placement, job.resume_on):
            if p is None:
                continue
            end = job.expected_end if p is job.placement else None
            for node, gpus in p.parts():
                for g in gpus:
                    left[node, g] = np.inf if end is None else max(end - now, 0.0)
    order = sorted(state.nodes, key=lambda n: -len(free[n]))[:NODES]
    for i, name in enumerate(order):
        times = sorted(left.get((name, g), 0.0) for g in state.nodes[name].gpus)[:GPUS]
        base = i * GPUS
        for k, t in enumerate(times):
            vec[base + k] = 1.0 if t == np.inf else squash(t)

    ready = fifo_candidates(state, now)
    jobs = tuple(islice(ready, WINDOW))
    mask = np.zeros(WINDOW + 1, dtype=bool)
    places = tuple(pack(j, free) for j in jobs)
    forced = bool(jobs) and state.overtaken(jobs[0].id) >= bound
    base = NODES * GPUS
    for i, job in enumerate(jobs):
        mask[i] = places[i] is not None and (i == 0 or not forced)
        run = run_time(job)
        row = [1.0, float(mask[i]), job.demand / GPUS, _wait(job, now),
               0.5 if run is None else squash(run)]
        row += _profile(job)
        place = places[i]
        row.append((len(free[place[0]]) - len(place[1])) / GPUS if place else -1.0)
        row.append(_speed(job, len(place[1])) if place else 0.0)
        row.append(min(state.overtaken(job.id) / bound, 1.0) if bound > 0 else 1.0)
        vec[base + i * PER_JOB: base + (i + 1) * PER_JOB] = row
    mask[NOTHING] = bool(engaged) or not mask[:NOTHING].any()

    rest = list(islice(ready, BEHIND))
    count = max(state.ready_count - len(jobs), len(rest))  # those in a back-off count too
    stats = base + WINDOW * PER_JOB
    if rest:
        runs = [run_time(j) for j in rest]
        vec[stats: stats + 4] = (
            count / (count + WINDOW), sum(j.demand for j in rest) / len(rest) / GPUS,
            sum(0.5 if r is None else squash(r) for r in runs) / len(runs),
            sum(_wait(j, now) for j in rest) / len(rest))
    total = sum(n.size for n in state.nodes.values())
    vec[stats + 4] = sum(len(g) for g in free.values()) / total if total else 0.0
    return Observation(vec, mask, jobs, places)


def _wait(job: Job, now: float) -> float:
    return squash(now - job.submitted) if job.submitted is not None else 0.0


def _speed(job: Job, count: int) -> float:
    """Its speed on `count` GPUs over its speed on its demand."""
    curve = job.curve
    if curve is None or not curve.possible(job.demand):
        return min(count, job.demand) / job.demand
    return min(curve.throughput(count) / curve.throughput(job.demand), 1.0)


def _profile(job: Job) -> list[float]:
    """Its speed on each of `PROFILED` counts over the best of them and its own count."""
    curve = job.curve
    if curve is None or not curve.possible(job.demand):
        return [min(g, job.demand) / job.demand for g in PROFILED]
    speeds = [curve.throughput(g) if curve.possible(g) else 0.0 for g in PROFILED]
    best = max(*speeds, curve.throughput(job.demand))
    return [s / best for s in speeds]
