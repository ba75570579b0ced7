"""Why a job is where it is, in words: `marble explain` and `marble show` (pure).

From the live state, the policy, the job's curve and its recorded events: why this GPU
count (its curve, its fastest count, what is free), why it waits (the jobs ahead, a
dependency, when GPUs should free up), why it was suspended, promoted or moved by what
was learned of its model, what failed. The count it aims for is `core.target`'s.
"""

from __future__ import annotations

from collections.abc import Iterable

from marbled.core.failures import error_line
from marbled.core.model import Job, JobState, Role, State
from marbled.core.policy.base import Policy, role_now, settled
from marbled.core.target import Target, gpus_text

RUN_STARTS = ("started", "resumed")


def _when(seconds: float) -> str:
    return f"in about {seconds:.0f} s" if seconds >= 1 else "within a second"


def reasons(job: Job, state: State, policy: Policy, now: float,
            history: Iterable[tuple[str, dict]] = (), expected_start: float | None = None,
            aim: Target | None = None, scale: float = 1.0,
            ends: dict[int, float] | None = None) -> list[str]:
    """Lines of explanation, most important first. `history`: the job's events in order as
    (kind, data); `expected_start`: the forecast's start for a waiting job; `aim`: its target
    count and why (`core.target`, what `marble curves` and `status` show); `scale`: real
    seconds per profiled second of an emulated job (its speeds are real, with the profiled
    figure `marble curves` shows beside them); `ends`: when each running job ends at its own
    speed, the ETA `status` shows (else the policy's expectation is used)."""
    events = list(history)
    lines = [f"it has ended: {job.state.value}" if job.state.finished
             else f"it {policy.explain(job, state, now)}"]
    lines += _count(job, state, policy, now, aim, scale)
    if not job.state.finished and (plan := policy.plan_line()):
        lines.append(plan)
    if job.state in (JobState.QUEUED, JobState.SUSPENDED) and job.resume_on is None:
        lines += _wait(job, state, now, expected_start, ends)
        lines += _overtaken(job, state, policy)
    lines += _past(events)
    return lines


def _count(job: Job, state: State, policy: Policy, now: float, aim: Target | None,
           scale: float = 1.0) -> list[str]:
    """Why this GPU count (or this demand)."""
    if not job.malleable:
        if job.nodes_min is not None:  # a node range: its GPUs in all, on as few nodes as fit
            asked = (f"{gpus_text(job.demand * job.nodes)} in all, on {job.nodes_min} to "
                     f"{job.nodes} nodes")
        else:
            asked = (f"exactly {gpus_text(job.demand)}"
                     + (f" on each of {job.nodes} nodes" if job.nodes > 1 else ""))
        return [f"it asked for {asked}, so it runs on that count: never resized (never "
                "suspended by the policy; a shutdown or `marble suspend` checkpoints it)"]
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
        secondary = role_now(job, state, policy.promotes) is Role.SECONDARY
        if secondary and job.move:
            out.append(f"what was learned of its model raised its count ({job.move}): it is "
                       f"moved to {gpus_text(job.demand)} when they are free"
                       if policy.promotes else f"the {policy.name} policy does not move a "
                       "running job: its next run uses the new count")
        elif secondary:
            out.append("it runs as a secondary on GPUs the jobs ahead left over"
                       + ("; it is promoted (suspended and resumed on more GPUs) when they "
                          "free up" if policy.promotes else ""))
        else:
            out.append(f"the {policy.name} policy sized it by the load: "
                       f"{policy.summary}")
    return out


def _shrink(job: Job, policy: Policy, now: float) -> str:
    """Whether and when a job above its count is brought down to it."""
    if not policy.shrinks and policy.reshapes:
        return (f"the {policy.name} policy sizes running jobs by the load, not by this count "
                f"({policy.summary})")
    if not policy.shrinks:
        return (f"the {policy.name} policy does not move a running job to fewer GPUs; its "
                "next run uses its count")
    if policy.shrinks_now(job, now):  # the rule the policy's decisions use: one truth
        return f"it is being moved to {gpus_text(job.demand)} ({job.move or 'its optimum'})"
    if job.nodes > 1:
        return (f"the {policy.name} policy does not move a job on several nodes to fewer "
                "GPUs; its next run uses its count")
    if not settled(job, now):
        return "it is moved once its run has lasted longer than a move costs"
    return "moving it would cost more time than it saves, so it keeps them to its end"


def _overtaken(job: Job, state: State, policy: Policy) -> list[str]:
    """The later jobs that run while it waits, and the rule that let them go first."""
    later = [j.id for j in state.engaged() if j.id > job.id and j.placement is not None]
    if not later:
        return []
    shown = ", ".join(str(i) for i in sorted(later)[:5]) + (", ..." if len(later) > 5 else "")
    return [f"{len(later)} later job(s) run while it waits ({shown}): {policy.overtaking}"]


def _wait(job: Job, state: State, now: float, expected_start: float | None,
          ends: dict[int, float] | None = None) -> list[str]:
    """When a waiting job should start; `ends`: the running jobs' ETAs (see `reasons`)."""
    out = []
    running = [j.id for j in state.jobs.values() if j.placement is not None]
    soonest = sorted((end, i) for i in running
                     if (end := (ends or {}).get(i, state.jobs[i].expected_end)) is not None)
    if soonest:
        end, other = soonest[0]
        out.append(f"the next run to end is job {other}'s, {_when(max(end - now, 0.0))}")
    if expected_start is not None:
        back_off = job.not_before if job.not_before is not None and job.not_before > now \
            else None
        if back_off is None:
            out.append(f"it should start {_when(max(expected_start - now, 0.0))} (simulated "
                       "from now)")
        elif expected_start > back_off + 1:  # the back-off (the first line) ends first
            out.append(f"it should start {_when(expected_start - now)}, after its back-off "
                       "(simulated from now)")
    return out


MOVES = {"promote": "it was promoted", "explore": "it was moved to explore its model's curve",
         "learned optimum": "it was moved to its learned optimum",
         "profile optimum": "it was moved to its profile's optimum"}


def _past(events: list[tuple[str, dict]]) -> list[str]:
    """Its runs, suspensions, moves (each by the reason of the suspension before it) and
    failures, from its events. A run start's `step` is the step the broker expects it to
    restore, true unless the run before it ended (failed, stopped by force) without
    acknowledging a checkpoint; `restored`, where the view adds it, is the step the run's
    own first report said it restored."""
    out = []
    # (GPUs, role, where it started, why the run before it was suspended, how that one ended)
    runs: list[tuple[list, str | None, str, str | None, str | None]] = []
    asked_for, acked, ended = None, False, None  # of the run so far
    acked_before = True  # the run before the current one left the step it was expected to
    checkpointed, forced, outran = [], [], []  # suspension requests, by how the run ended
    fallbacks, held = [], []
    for kind, d in events:
        if kind == "reshape-held":
            held.append(d.get("reason"))
        elif kind == "suspend-requested":
            asked_for = d.get("reason")
        elif kind == "acknowledged":
            acked = True
        elif kind in RUN_STARTS:
            acked_before = acked or ended not in ("failed", "suspended")
            if d.get("restored") is not None:
                where = f"step {d['restored']}"
            elif acked_before:
                where = f"step {d.get('step')}"
            else:  # its first report will say which checkpoint it found
                where = "its last checkpoint"
            runs.append((d.get("gpus") or [], d.get("role"), where, asked_for, ended))
            asked_for, acked, ended = None, False, None
        elif kind == "checkpoint-fallback":
            fallbacks.append((d, acked_before))
        elif kind in ("done", "suspended", "failed", "cancelled"):
            ended = kind
            if asked_for is not None:
                if kind == "suspended":
                    (checkpointed if acked else forced).append(asked_for)
                else:
                    outran.append(f"{asked_for}: {d.get('detail') or kind}")
    if len(runs) > 1:
        out.append("its runs: " + " -> ".join(f"{gpus_text(len(g))} ({role}) from {where}"
                                              for g, role, where, _, _ in runs))
    for (before, *_), (after, _, where, why, ended) in zip(runs, runs[1:], strict=False):
        if len(after) != len(before):
            if ended == "failed":
                did, how = "after a failure it was retried", "restarting from its last " \
                    "checkpoint"
            else:
                did = MOVES.get(why, f"after a suspension ({why or 'a restart'}) it resumed")
                how = "resuming from its checkpoint"
            out.append(f"{did} from {len(before)} to {gpus_text(len(after))} at {where}, "
                       f"{how}")
    if checkpointed:
        out.append(f"suspended {len(checkpointed)} time(s): "
                   + "; ".join(str(r) for r in checkpointed))
    if forced:
        out.append(f"stopped without a checkpoint {len(forced)} time(s) (asked to suspend, "
                   "it acknowledged none): " + "; ".join(str(r) for r in forced))
    if outran:
        out.append(f"asked to suspend {len(outran)} time(s), but its run ended first: "
                   + "; ".join(outran))
    if held:
        out.append(f"a move was held {len(held)} time(s) until its run had trained its first "
                   "step (moving it sooner would throw its start-up away): "
                   + "; ".join(str(r) for r in held))
    for kind, data in events:
        if kind == "failed":
            # a per-GPU run's detail quotes its failing rank's error already; else the
            # traceback's exception or the last line, never the launcher's own summary
            error = None if data.get("error") else \
                error_line(str(data.get("stderr_tail") or "").splitlines())
            out.append(f"a run failed: {data.get('detail') or 'no detail'}"
                       + (f"; its stderr ends: {error}" if error else ""))
    for data, acknowledged in fallbacks:
        if acknowledged:
            out.append(f"a run restored an older checkpoint than the one acknowledged: {data}")
        else:
            restored, expected = data["restored"], data["expected"]
            out.append(f"a run restarted from step {restored}: the run before it acknowledged "
                       f"no checkpoint (its last known step: {expected}), so steps "
                       f"{restored + 1}-{expected} ran again")
    return out
