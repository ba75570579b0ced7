"""Admission: which submitted jobs the broker accepts, all of a batch or none (pure).

Every check happens before anything is stored: the request's fields (`JobSpec`),
the GPU demand from the profile (`size_job`), what the policy can never run
(`Policy.feasible`), and the dependencies, given as ids or names of earlier jobs
(of this batch or before it). A model is recorded under the profile's name, whatever
alias or spelling the request used; one the book has no curve for gets a note.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from marbled.core.errors import Invalid, Never, NotFound, Refusal, Unavailable
from marbled.core.model import Job, State
from marbled.core.policy.base import Policy
from marbled.core.profiles import ProfileBook
from marbled.core.spec import JobSpec, SpecError, size_job, unknown_model_note


@dataclass(frozen=True)
class Admitted:
    spec: JobSpec
    job: Job  # as it enters the state: id, demand, kind, resolved dependencies
    notes: tuple[str, ...] = ()  # what the user should know (a model no profile knows)


def admit(specs: list[JobSpec], *, first_id: int, state: State, book: ProfileBook,
          policy: Policy, names: Mapping[str, int],
          workdir_problem: Callable[[str], str | Refusal | None] = lambda path: None
          ) -> list[Admitted]:
    """The jobs for `specs`, numbered from `first_id`; raises SpecError (naming the job of
    the batch and the field), NotFound, Never or Unavailable, and then accepts none of them.
    `workdir_problem` says what keeps a job from running in its `chdir` (None: nothing): the
    refusal to raise, or a text (bad input, a SpecError)."""
    if not state.nodes:
        raise Unavailable("the broker has no GPUs")
    node_max = state.max_node_size
    batch_names: dict[str, int] = {}
    workdirs: dict[str, str | None] = {}  # each directory's problem, looked at once a batch
    out = []
    for i, spec in enumerate(specs):
        job_id = first_id + i
        try:
            if spec.chdir is not None and spec.chdir not in workdirs:  # once a directory
                workdirs[spec.chdir] = workdir_problem(spec.chdir)
            problem = workdirs.get(spec.chdir)
            if isinstance(problem, Refusal):
                raise problem
            if problem:
                raise SpecError("chdir", problem)
            sizing = size_job(spec, book, node_max, len(state.nodes))
            after = tuple(_dependency(ref, job_id, first_id, first_id + len(specs), state,
                                      names, batch_names) for ref in spec.after)
            job = Job(job_id, sizing.demand, sizing.malleable, after, spec.nodes,
                      nodes_min=spec.nodes_min, max_share=sizing.max_share)
            never = policy.feasible(job, state)
            if never:
                raise SpecError(*never)
        except (SpecError, NotFound, Never) as exc:
            if len(specs) == 1:
                raise
            raise in_batch(exc, i) from None
        if spec.name:
            batch_names[spec.name] = job_id
        note = unknown_model_note(spec, sizing, book)
        curve = book.lookup(spec.model) if spec.model else None
        out.append(Admitted(replace(spec, model=curve.model) if curve else spec, job,
                            (note,) if note else ()))
    return out


def in_batch(exc: Refusal, i: int) -> Refusal:
    """A refusal of job `i` (from 0) of a batch: the message counts as people (and a job
    file's reader) do, 'job 2: steps: ...'; `field` is the request's JSON path, 'jobs[1].steps'.
    It keeps its kind (its HTTP status): not found, never, else bad input."""
    kind = NotFound if isinstance(exc, NotFound) else Never if isinstance(exc, Never) \
        else Invalid
    return kind(f"job {i + 1}: {exc}", f"jobs[{i}].{exc.field}")


def _dependency(ref: int | str, job_id: int, first_id: int, end_id: int, state: State,
                names: Mapping[str, int], batch_names: Mapping[str, int]) -> int:
    """The id of the earlier job `ref` names. A job that does not exist is NotFound (404);
    so is one of this batch that is not earlier (itself, a later one): there is no earlier
    job with that id, and a client cannot know the ids its request will get (no document can
    refuse it: the request is well formed)."""
    if isinstance(ref, str):  # (`names` may read the store: only for a name not of the batch)
        dep = batch_names[ref] if ref in batch_names else names.get(ref)
    else:
        dep = ref
    hint = "give the id or name of a job submitted before this one"
    if dep is None:
        raise NotFound(f"after: no job is named '{ref}' ({hint})", "after")
    if job_id <= dep < end_id:
        which = "this job" if dep == job_id else "later in this request"
        raise NotFound(f"after: job {dep} is {which}, not an earlier job ({hint})", "after")
    if dep >= end_id or (dep < first_id and state.outcome(dep) is None):
        raise NotFound(f"after: there is no job {dep} ({hint})", "after")
    return dep
