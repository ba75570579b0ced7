"""Why a job is where it is, in words: `marble explain` and `marble show` (pure).

From the live state, the policy, the job's curve and its recorded events: why this GPU
count (its curve, its fastest count, what is free), why it waits (the jobs ahead, a
dependency, when GPUs should free up), why it was suspended, promoted or moved by what
was learned of its model, what failed. The count it aims for is `core.target`'s.
"""

from __future__ import annotations

from collections.abc import Iterable

from marbled.core.model import Job, JobState, Role, State
from marbled.core.policy.base import Policy, reshape_pays, settled
from marbled.core.target import Target, gpus_text

RUN_STARTS = ("started", "resumed")


def _when(seconds: float) -> str:
    return f"in about {seconds:.0f} s" if seconds >= 1 else "within a second"


def reasons(job: Job, state: State, policy: Policy, now: float,
            history: Iterable[tuple[str, dict]] = (), expected_start: float | None = None,
            aim: Target | None = None, scale: float = 1.0) -> list[str]:
    """Lines of explanation, most important first. `history`: the job's events in order as
    (kind, data); `expected_start`: the forecast's start for a waiting job; `aim`: its target
    count and why (`core.target`, what `marble curves` and `status` show); `scale`: real
    seconds per profiled second of an emulated job (its speeds are real, with the profiled
    figure `marble curves` shows beside them)."""
    events = list(history)
    lines = [f"it has ended: {job.state.value}" if job.state.finished
             else f"it {policy.explain(job, state, now)}"]
    lines += _count(job, state, policy, now, aim, scale)
    if job.state in (JobState.QUEUED, JobState.SUSPENDED) and job.resume_on is None:
        lines += _wait(job, state, now, expected_start)
    lines += _past(events)
    return lines


def _count(job: Job, state: State, policy: Policy, now: float, aim: Target | None,
           scale: float = 1.0) -> list[str]:
    """Why this GPU count (or this demand)."""
    if not job.malleable:
        return [f"it asked for exactly {gpus_text(job.demand)} per node, so it runs on that "
                "count and is never suspended"]
    out = [] if job.state.finished else \
        [f"it aims for {aim.text if aim else gpus_text(job.demand)}"]
    curve = job.curve
    if curve is None:
        out.append("its model has no curve yet: the broker measures what its runs give")
    else:
        best = curve.throughput(job.demand)
        out.append(f"its curve on {gpus_text(job.demand)} of a node: {best:.3g} steps/s"
                   + (f" ({best * scale:.3g} profiled: emulated at time scale {scale:g})"
                      if scale != 1 else ""))
    if job.placement is not None and job.placement.share > 1:
        out.append(f"it shares one GPU with up to {job.placement.share - 1} other run(s): the "
                   "GPUs are oversubscribed and its profile says it trains usefully so")
    elif job.placement is not None and len(job.gpus) > job.demand:
        out.append(f"it holds {gpus_text(len(job.gpus))}, more than it aims for: "
                   + _shrink(job, policy, now))
    elif job.placement is not None and len(job.gpus) != job.demand:
        have, free = len(job.gpus), len(state.free(job.placement.node))
        if curve is not None:
            rate = curve.throughput(have) if curve.possible(have) else 0.0
            out.append(f"on its {gpus_text(have)} it trains at {rate:.3g} steps/s, "
                       f"{100 * rate / best:.0f}% of that; {gpus_text(free)} of "
                       f"{job.placement.node} {'is' if free == 1 else 'are'} free now")
        if job.role is Role.SECONDARY and job.move:
            out.append(f"what was learned of its model raised its count ({job.move}): it is "
                       f"moved to {gpus_text(job.demand)} when they are free"
                       if policy.promotes else f"the {policy.name} policy does not move a "
                       "running job: its next run uses the new count")
        elif job.role is Role.SECONDARY:
            out.append("it runs as a secondary on GPUs the jobs ahead left over"
                       + ("; it is promoted (suspended and resumed on more GPUs) when they "
                          "free up" if policy.promotes else ""))
        else:
            out.append(f"the {policy.name} policy sized it by the load: "
                       f"{policy.summary}")
    return out


def _shrink(job: Job, policy: Policy, now: float) -> str:
    """Whether and when a job above its count is brought down to it."""
    if not policy.shrinks:
        return (f"the {policy.name} policy does not move a running job to fewer GPUs; its "
                "next run uses its count")
    if not settled(job, now):
        return "it is moved once its run has lasted longer than a move costs"
    if reshape_pays(job, job.demand, now) is False:
        return "moving it would cost more time than it saves, so it keeps them to its end"
    return f"it is being moved to {gpus_text(job.demand)} ({job.move or 'its optimum'})"


def _wait(job: Job, state: State, now: float, expected_start: float | None) -> list[str]:
    """When a waiting job should start."""
    out = []
    ends = sorted((j.expected_end, j.id) for j in state.jobs.values()
                  if j.placement is not None and j.expected_end is not None)
    if ends:
        end, other = ends[0]
        out.append(f"the next run to end is job {other}'s, {_when(max(end - now, 0.0))}")
    if expected_start is not None:
        out.append(f"it should start {_when(max(expected_start - now, 0.0))} (simulated from "
                   "now)")
    return out


MOVES = {"promote": "it was promoted", "explore": "it was moved to explore its model's curve",
         "learned optimum": "it was moved to its learned optimum",
         "profile optimum": "it was moved to its profile's optimum"}


def _past(events: list[tuple[str, dict]]) -> list[str]:
    """Its runs, suspensions, moves (each by the reason of the suspension before it) and
    failures, from its events."""
    out = []
    runs, asked_for = [], None  # (GPUs, role, step, why the run before it was suspended)
    for kind, d in events:
        if kind == "suspend-requested":
            asked_for = d.get("reason")
        elif kind in RUN_STARTS:
            runs.append((d.get("gpus") or [], d.get("role"), d.get("step"), asked_for))
            asked_for = None
    if len(runs) > 1:
        out.append("its runs: " + " -> ".join(f"{gpus_text(len(g))} ({role}) from step {step}"
                                              for g, role, step, _ in runs))
    for (before, *_), (after, _, step, why) in zip(runs, runs[1:], strict=False):
        if len(after) != len(before):
            did = MOVES.get(why, f"after a suspension ({why or 'a restart'}) it resumed")
            out.append(f"{did} from {len(before)} to {gpus_text(len(after))} at step "
                       f"{step}, resuming from its checkpoint")
    asked = [d.get("reason") for k, d in events if k == "suspend-requested"]
    if asked:
        out.append(f"suspended {len(asked)} time(s): " + "; ".join(str(r) for r in asked))
    for kind, data in events:
        if kind == "failed":
            tail = str(data.get("stderr_tail") or "").strip().splitlines()
            out.append(f"a run failed: {data.get('detail') or 'no detail'}"
                       + (f"; its stderr ends: {tail[-1][:200]}" if tail else ""))
        elif kind == "checkpoint-fallback":
            out.append(f"a run restored an older checkpoint than the one acknowledged: {data}")
    return out
