"""Moldable Equipartition (Fujiwara et al.): share the vacant GPUs out when jobs start.

At each decision the eligible waiting jobs share out the vacant GPUs (and the
room left on shared GPUs) by Equipartition with D'Hondt (`equipartition.py`,
which lists the cases and how we fitted them to a node-level broker; a node left
with no job takes a job that gets more GPUs there). Running
jobs are never touched: that is the malleable variant (`malleable.py`).

As published, a job keeps the count it started with to its end: a long job that
arrived when one GPU was free runs on that one GPU even after the others empty
(on a trace of jobs days long this made the makespan 2.4x rigid's on 16 nodes).
"""

from __future__ import annotations

from marbled.core.model import State
from marbled.core.policy.base import Policy, fifo_candidates
from marbled.core.policy.equipartition import free_units, plan


class MoldableEquipartition(Policy):
    name = "moldable"
    summary = "Equipartition of the free GPUs when jobs start (Fujiwara et al.)"

    def choose(self, state: State, now: float) -> list:
        grants = plan(fifo_candidates(state, now), free_units(state), {})
        return [grants[i].start(state.jobs[i]) for i in sorted(grants)]
