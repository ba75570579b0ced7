"""Submissions: what the broker refuses, the ids it gives, and the jobs' entry into its
state; and their leaving it once ended for good, so that what the broker holds grows with
the live jobs, not with every job ever (whatever asks of an ended job later reads the
store: the state's `ended` lookup, `Names`, the views)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

from marbled.core.admission import admit
from marbled.core.errors import Never, NotFound, Unavailable
from marbled.core.evolve import evolve
from marbled.core.model import Job, JobState
from marbled.core.spec import JobSpec
from marbled.daemon.memory import TRIM_EVERY, compact, give_back_freed
from marbled.paths import workdir_problem
from marbled.store.db import Store, request_digest

if TYPE_CHECKING:
    from marbled.daemon.broker import Broker


def workdir_refusal(path: str) -> NotFound | Never | str | None:
    """What keeps a job from running in `path` (its `chdir`), as the API answers it: a
    relative path is bad input (400; the OpenAPI document refuses it too); a directory that
    is not there (nothing, or a file) is not found (404), as an `after` that names no job:
    the request is well formed, and no document can list the host's directories; one that
    cannot be entered is a 409 (never, for this path)."""
    problem = workdir_problem(path)
    if problem is None or not os.path.isabs(path):
        return problem
    if not os.path.isdir(path):
        return NotFound(f"chdir: {problem}", "chdir")
    return Never(f"chdir: {problem}", "chdir")


def recorded(store: Store, job_id: int) -> JobState | None:
    """`State.ended`: the state the store records of a job the state does not hold (one
    that ended and was forgotten); None if there is no such job."""
    state = store.job_state(job_id)
    return JobState(state) if state is not None else None


class Names(dict):
    """Job names to ids, as `after:` names them: the latest job of each name. The names of
    the jobs the broker holds are kept (a submission of a group not yet committed may name
    them); the others are read from the store (`get`, ix_jobs_name), so that a broker
    keeps no name of an ended job."""

    def __init__(self, store: Store):
        super().__init__()
        self.store = store

    def get(self, name: str, default: int | None = None) -> int | None:
        job_id = super().get(name)
        if job_id is None:
            job_id = self.store.job_named(name)
        return default if job_id is None else job_id

    def forget(self, name: str, job_id: int) -> None:
        """Job `job_id` leaves the broker: its name is read from the store from now on."""
        if super().get(name) == job_id:
            del self[name]


class Intake:
    def __init__(self, broker: Broker):
        self.broker = broker
        self.next_id = broker.store.next_job_id()  # only this broker writes the store
        self.leaving: list[int] = []  # ended for good, to leave the state (forget_ended)
        self.left_since_trim = 0  # jobs that left since the memory was last given back

    def submit(self, specs: list[JobSpec]) -> list:
        """Accept all of `specs` or none; the stored rows, in order (committed on return)."""
        admitted = self._admit(specs)
        rows = self.broker.ledger.submitted(admitted, self.broker.clock.time())
        self._accepted(admitted, rows)
        return rows

    def submit_grouped(self, specs: list[JobSpec],
                       key: str | None = None) -> tuple[list, asyncio.Future, bool]:
        """As `submit`, for the API: the rows, a future done once they are durable, and
        whether this answers again a submission made before with idempotency key `key`
        (its rows and future; Never if it submitted other jobs). The rows of the
        submissions that arrive together are committed in one transaction (a group commit);
        the API answers when it has committed."""
        store = self.broker.store
        first = store.requested(key) if key is not None else None
        if first is not None:
            digest, first_id, count, answer = first
            if digest != request_digest(specs):
                raise Never(f"the Idempotency-Key '{key}' was used for another request (jobs "
                            f"{first_id}-{first_id + count - 1}); send a new key with each "
                            "new request, and the same key only with the same jobs",
                            "Idempotency-Key")
            if answer is None:  # submitted before a restart: the rows as they are now
                answer = (store.jobs(list(range(first_id, first_id + count))),
                          asyncio.get_running_loop().create_future())
                answer[1].set_result(None)
            return answer[0], answer[1], True
        admitted = self._admit(specs)
        at = self.broker.clock.time()
        also = None if key is None else store.request_made(
            key, request_digest(specs), admitted[0].job.id, len(admitted), at)
        try:
            rows, durable = self.broker.ledger.submit_grouped(admitted, at, also=also)
        except BaseException:
            if key is not None:
                store.requests.pop(key, None)
            raise
        if key is not None:  # a retry while the rows are stored waits for them too
            store.request_answered(key, (rows, durable))
        # The state takes the jobs now (a later submission of the group may name them); any
        # store write, a decision's included, commits the group's rows first.
        self._accepted(admitted, rows)
        return rows, durable, False

    def _admit(self, specs: list[JobSpec]) -> list:
        b = self.broker
        if b.draining:
            raise Unavailable("the broker is shutting down; submit to the next broker")
        if b.failure is not None:
            raise Unavailable("the broker is stopping: its store could not commit")
        if b.ledger.fault is not None:
            raise Unavailable(f"the broker cannot write its store now: {b.ledger.fault}; "
                              "running jobs go on: submit again once it is freed")
        # a job that names no directory runs in the broker's (an API client's own is unknown)
        specs = [s if s.chdir else evolve(s, chdir=str(b.config.workdir)) for s in specs]
        return admit(specs, first_id=self.next_id, state=b.state, book=b.book,
                     policy=b.policy, names=b.names, workdir_problem=workdir_refusal)

    def _accepted(self, admitted: list, rows: list) -> None:
        for a, row in zip(admitted, rows, strict=True):
            row.notes = list(a.notes)  # for the submit answer only: not stored
            self.add(evolve(a.job, submitted=row.submitted_at), a.spec)
            if a.spec.name:
                self.broker.names[a.spec.name] = a.job.id
        self.next_id += len(admitted)
        self.broker.wake()

    def add(self, job: Job, spec: JobSpec, done: int = 0) -> None:
        """A job enters the state (at its submission, or rebuilt at a restart with `done`
        steps checkpointed), with what the book knows of its model."""
        b = self.broker
        b.specs[job.id] = spec
        largest = b.state.max_node_size
        if job.malleable and job.demand > largest:
            # a job on `auto` that a larger allocation sized (a restart in a smaller one):
            # sized again as a submission here would be, so that no policy waits for more
            # than a node has
            demand = b.book.demand(spec.model, largest) if spec.model else None
            job = evolve(job, demand=demand or largest)
        b.state.submit(evolve(job, curve=b.curve_of(job.id),
                              steps_left=max(spec.steps - done, 0) if spec.steps else None))
        if b.learner:
            b.learner.track(job.id)

    def withdraw(self, job_ids: Iterable[int]) -> None:
        """Jobs whose rows the store refused were never accepted: they leave the state (no
        count or view shows them), and their names are free again."""
        b = self.broker
        for job_id in job_ids:
            job, spec = b.state.jobs.get(job_id), b.specs.pop(job_id, None)
            if job is not None and job.state is JobState.QUEUED:
                b.state.withdraw(job_id)
            if spec is not None and spec.name:
                b.names.forget(spec.name, job_id)

    def state_of(self, job_id: int) -> JobState:
        """The job's state, held or (ended) recorded; NotFound if there is no such job."""
        state = self.broker.state.outcome(job_id)
        if state is None:
            raise NotFound(f"no job {job_id}", "id")
        return state

    def forget_ended(self) -> None:
        """The jobs that ended for good leave the state, their specs and names: what they left
        is in the store, which answers for them from now on. Only once their ends are
        committed (none held for a fault, `ledger.fault`, nor for the next decision,
        `ledger.ends_held`), so that the store's answer is their end."""
        b = self.broker
        if not self.leaving or b.ledger.fault is not None or b.ledger.ends_held:
            return
        ended, self.leaving = self.leaving, []
        for job_id in ended:
            job = b.state.jobs.get(job_id)
            if job is None or not job.state.finished:
                continue
            if job_id in b.runs.live or job_id in b.runs.launching:
                self.leaving.append(job_id)  # its process is still seen to: later
                continue
            b.state.forget(job_id)
            if b.learner:
                b.learner.untrack(job_id)
            spec = b.specs.pop(job_id, None)
            if spec is not None and spec.name:
                b.names.forget(spec.name, job_id)
            self.left_since_trim += 1
        # what they held, back to the system once the state is empty or many have left
        if self.left_since_trim and (not b.state.jobs or self.left_since_trim >= TRIM_EVERY):
            self.left_since_trim = 0
            compact(b.state, b.ledger, b.runs, b.files, b)
            give_back_freed()
