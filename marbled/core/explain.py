"""Why a job is where it is, in words: `marble explain` and `marble show` (pure).

From the live state, the policy, the job's curve and its recorded events: why this GPU
count (its curve, its fastest count, what is free), why it waits (the jobs ahead, a
dependency, when GPUs should free up), why it was suspended or promoted, what failed.
"""

from __future__ import annotations

from collections.abc import Iterable

from marbled.core.model import Job, JobState, Role, State
from marbled.core.policy.base import Policy

RUN_STARTS = ("started", "resumed")


def _when(seconds: float) -> str:
    return f"in about {seconds:.0f} s" if seconds >= 1 else "within a second"


def reasons(job: Job, state: State, policy: Policy, now: float,
            history: Iterable[tuple[str, dict]] = (), expected_start: float | None = None
            ) -> list[str]:
    """Lines of explanation, most important first. `history`: the job's events in order as
    (kind, data); `expected_start`: the forecast's start for a waiting job."""
    events = list(history)
    lines = [f"it has ended: {job.state.value}" if job.state.finished
             else f"it {policy.explain(job, state, now)}"]
    lines += _count(job, state, policy)
    if job.state in (JobState.QUEUED, JobState.SUSPENDED) and job.resume_on is None:
        lines += _wait(job, state, now, expected_start)
    lines += _past(events)
    return lines


def _count(job: Job, state: State, policy: Policy) -> list[str]:
    """Why this GPU count (or this demand)."""
    if not job.malleable:
        return [f"it asked for exactly {job.demand} GPU(s) per node, so it runs on that count "
                "and is never suspended"]
    curve = job.curve
    if curve is None:
        return [f"its model has no curve yet: it is sized at {job.demand} GPU(s) while the "
                "broker measures what more GPUs give"]
    best = curve.throughput(job.demand)
    out = [f"its curve trains fastest on {job.demand} GPU(s) of a node "
           f"({best:.3g} steps/s on the broker's clock)"]
    if job.placement is not None and job.placement.share > 1:
        out.append(f"it shares one GPU with up to {job.placement.share - 1} other run(s): the "
                   "GPUs are oversubscribed and its profile says it trains usefully so")
    elif job.placement is not None and len(job.gpus) != job.demand:
        have = len(job.gpus)
        rate = curve.throughput(have) if curve.possible(have) else 0.0
        free = len(state.free(job.placement.node))
        out.append(f"on its {have} GPU(s) it trains at {rate:.3g} steps/s, "
                   f"{100 * rate / best:.0f}% of that; {free} GPU(s) of "
                   f"{job.placement.node} are free now")
        if job.role is Role.SECONDARY:
            out.append("it runs as a secondary on GPUs the jobs ahead left over"
                       + ("; it is promoted (suspended and resumed on more GPUs) when they "
                          "free up" if policy.promotes else ""))
        else:
            out.append(f"the {policy.name} policy sized it by the load: "
                       f"{policy.summary}")
    return out


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


def _past(events: list[tuple[str, dict]]) -> list[str]:
    """Its runs, suspensions, promotions and failures, from its events."""
    out = []
    runs = [(d.get("gpus") or [], d.get("role"), d.get("step")) for k, d in events
            if k in RUN_STARTS]
    if len(runs) > 1:
        out.append("its runs: " + " -> ".join(f"{len(g)} GPU(s) ({role}) from step {step}"
                                              for g, role, step in runs))
    for (before, _, _), (after, _, step) in zip(runs, runs[1:], strict=False):
        if len(after) > len(before):
            out.append(f"it was promoted from {len(before)} to {len(after)} GPUs at step "
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
