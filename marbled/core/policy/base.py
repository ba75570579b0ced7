"""What every policy shares: the FIFO walk with dependencies."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

from marbled.core.model import Cancel, Job, JobState, Role, Start, State


class Policy(Protocol):
    name: str

    def decide(self, state: State, now: float = 0.0) -> list:
        """The actions to take at time `now`. Pure: reads `state`, never changes it."""
        ...

    def next_decision(self, state: State, now: float) -> float | None:
        """When the policy wants to decide again with no event (None: only on events).

        Drivers ask after each decision and decide again at that time unless an event
        comes first; a time at or before `now` asks for a decision at every poll."""
        ...


def dependency_status(job: Job, state: State) -> str:
    """'ready', 'wait' (a dependency is still to finish) or 'broken' (one failed)."""
    status = "ready"
    for dep in job.after:
        other = state.jobs.get(dep)
        if other is None or other.state in (JobState.FAILED, JobState.CANCELLED):
            return "broken"
        if other.state is not JobState.DONE:
            status = "wait"
    return status


def fifo_candidates(state: State, actions: list, now: float = 0.0) -> Iterator[Job]:
    """Waiting jobs in FIFO order whose dependencies are met.

    Jobs whose dependency can never be met are cancelled (appended to
    `actions`); jobs still waiting for a dependency are skipped, as the paper
    schedules "the next job which is marked as independent"; so are jobs that
    wait out a retry back-off (until `not_before`), without holding up the queue.
    """
    for job in state.waiting():
        if job.not_before is not None and job.not_before > now:
            continue
        status = dependency_status(job, state)
        if status == "broken":
            actions.append(Cancel(job.id, "a job it depends on failed or was cancelled"))
        elif status == "ready":
            yield job


def take_nodes(free: dict[str, list[int]], count: int,
               want: Callable[[str], int]) -> list[tuple[str, tuple[int, ...]]] | None:
    """`want(node)` of the lowest free GPUs on each of the first `count` nodes that have
    them, taken out of `free`; None (and `free` untouched) if fewer nodes have them."""
    chosen = [n for n in free if len(free[n]) >= want(n)][:count]
    if len(chosen) < count:
        return None
    parts = []
    for n in chosen:
        k = want(n)
        parts.append((n, tuple(free[n][:k])))
        free[n] = free[n][k:]
    return parts


def role_for(job: Job, gpus: int, share: int = 1) -> Role:
    """PRIMARY on the job's whole demand, else SECONDARY (never promoted)."""
    return Role.PRIMARY if share == 1 and gpus == job.demand else Role.SECONDARY


def resizing(jobs: list[Job]) -> bool:
    """Is one of these jobs still checkpointing for a suspend (its GPUs not yet free)?"""
    return any(j.state is JobState.SUSPENDING for j in jobs)


def start_on(job: Job, parts: list[tuple[str, tuple[int, ...]]], role: Role) -> Start:
    (node, gpus), *others = parts
    return Start(job.id, node, gpus, role, tuple(others))
