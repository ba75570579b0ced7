"""What every policy shares: the FIFO walk with dependencies."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from marbled.core.model import Cancel, Job, JobState, State


class Policy(Protocol):
    name: str

    def decide(self, state: State, now: float = 0.0) -> list:
        """The actions to take at time `now`. Pure: reads `state`, never changes it."""
        ...

    def next_decision(self, state: State, now: float) -> float | None:
        """When the policy wants to decide again with no event (None: only on events)."""
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


def fifo_candidates(state: State, actions: list) -> Iterator[Job]:
    """Waiting jobs in FIFO order whose dependencies are met.

    Jobs whose dependency can never be met are cancelled (appended to
    `actions`); jobs still waiting for a dependency are skipped, as the paper
    schedules "the next job which is marked as independent".
    """
    for job in state.waiting():
        status = dependency_status(job, state)
        if status == "broken":
            actions.append(Cancel(job.id, "a job it depends on failed or was cancelled"))
        elif status == "ready":
            yield job
