"""Scheduling policies: pure functions of the state, shared by the daemon and the simulator."""

from marbled.core.policy.base import Policy
from marbled.core.policy.elastic import ElasticPolicy
from marbled.core.policy.malleable import MalleablePolicy
from marbled.core.policy.marble import MarblePolicy
from marbled.core.policy.moldable import MoldablePolicy
from marbled.core.policy.rigid import RigidPolicy
from marbled.core.policy.timeslice import TimeslicePolicy

POLICIES: dict[str, type] = {
    "elastic": ElasticPolicy,
    "malleable": MalleablePolicy,
    "marble": MarblePolicy,
    "moldable": MoldablePolicy,
    "rigid": RigidPolicy,
    "timeslice": TimeslicePolicy,
}


def get_policy(name: str, time_slice: float | None = None,
               preempt_guard: float | None = None, grow_after: float | None = None) -> Policy:
    """A policy by name; `time_slice` (seconds) applies to 'timeslice', `preempt_guard`
    (seconds a run must have left to be reshaped) to 'malleable', `grow_after` (seconds a
    run lasts before it may double) to 'elastic'."""
    if name not in POLICIES:
        raise ValueError(f"unknown policy '{name}'; choose one of {sorted(POLICIES)}")
    if name == "timeslice" and time_slice is not None:
        return TimeslicePolicy(time_slice)
    if name == "malleable" and preempt_guard is not None:
        return MalleablePolicy(preempt_guard)
    if name == "elastic" and grow_after is not None:
        return ElasticPolicy(grow_after)
    return POLICIES[name]()


__all__ = ["POLICIES", "ElasticPolicy", "MalleablePolicy", "MarblePolicy", "MoldablePolicy",
           "Policy", "RigidPolicy", "TimeslicePolicy", "get_policy"]
