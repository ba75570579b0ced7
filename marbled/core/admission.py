"""Admission: which submitted jobs the broker accepts, all of a batch or none (pure).

Every check happens before anything is stored: the request's fields (`JobSpec`),
the GPU demand from the profile (`size_job`), what the policy can never run
(`Policy.feasible`), and the dependencies, given as ids or names of earlier jobs
(of this batch or before it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from marbled.core.errors import Unavailable
from marbled.core.model import Job, State
from marbled.core.policy.base import Policy
from marbled.core.profiles import ProfileBook
from marbled.core.spec import JobSpec, SpecError, size_job


@dataclass(frozen=True)
class Admitted:
    spec: JobSpec
    job: Job  # as it enters the state: id, demand, kind, resolved dependencies


def admit(specs: list[JobSpec], *, first_id: int, state: State, book: ProfileBook,
          policy: Policy, names: Mapping[str, int]) -> list[Admitted]:
    """The jobs for `specs`, numbered from `first_id`; raises SpecError (naming the job of
    the batch and the field) or Unavailable, and then accepts none of them."""
    if not state.nodes:
        raise Unavailable("the broker has no GPUs")
    node_max = state.max_node_size
    batch_names: dict[str, int] = {}
    out = []
    for i, spec in enumerate(specs):
        job_id = first_id + i
        try:
            sizing = size_job(spec, book, node_max, len(state.nodes))
            after = tuple(_dependency(ref, job_id, first_id, state, names, batch_names)
                          for ref in spec.after)
            job = Job(job_id, sizing.demand, sizing.malleable, after, spec.nodes,
                      max_share=sizing.max_share)
            never = policy.feasible(job, state)
            if never:
                raise SpecError(*never)
        except SpecError as exc:
            if len(specs) == 1:
                raise
            raise SpecError(f"jobs[{i}].{exc.field}", exc.message) from None
        if spec.name:
            batch_names[spec.name] = job_id
        out.append(Admitted(spec, job))
    return out


def _dependency(ref: int | str, job_id: int, first_id: int, state: State,
                names: Mapping[str, int], batch_names: Mapping[str, int]) -> int:
    dep = batch_names.get(ref, names.get(ref)) if isinstance(ref, str) else ref
    if dep is None or dep >= job_id or (dep < first_id and dep not in state.jobs):
        raise SpecError("after", f"'{ref}' is not an earlier job (give the id or name of a "
                                 "job submitted before this one)")
    return dep
