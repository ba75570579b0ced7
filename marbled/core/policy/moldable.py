"""Moldable Equipartition (Fujiwara et al.): share the vacant GPUs out when jobs start.

At each decision the eligible waiting jobs share out the vacant GPUs (and the
room left on shared GPUs) by Equipartition with D'Hondt (`equipartition.py`,
which lists the cases and how we fitted them to a node-level broker). Running
jobs are never touched: that is the malleable variant (`malleable.py`).
"""

from __future__ import annotations

from marbled.core.model import State
from marbled.core.policy.base import fifo_candidates
from marbled.core.policy.equipartition import free_units, plan


class MoldablePolicy:
    name = "moldable"

    def decide(self, state: State, now: float = 0.0) -> list:
        actions: list = []
        grants = plan(fifo_candidates(state, actions, now), free_units(state), {})
        return actions + [grants[i].start(state.jobs[i]) for i in sorted(grants)]

    def next_decision(self, state: State, now: float) -> float | None:
        return None  # events alone drive this policy
