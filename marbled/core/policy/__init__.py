"""Scheduling policies: pure functions of the state, shared by the daemon and the simulator."""

from marbled.core.policy.base import Policy
from marbled.core.policy.malleable import MalleablePolicy
from marbled.core.policy.marble import MarblePolicy
from marbled.core.policy.moldable import MoldablePolicy
from marbled.core.policy.rigid import RigidPolicy
from marbled.core.policy.timeslice import TimeslicePolicy

POLICIES: dict[str, type] = {
    "malleable": MalleablePolicy,
    "marble": MarblePolicy,
    "moldable": MoldablePolicy,
    "rigid": RigidPolicy,
    "timeslice": TimeslicePolicy,
}


def get_policy(name: str, time_slice: float | None = None,
               preempt_guard: float | None = None) -> Policy:
    """A policy by name; `time_slice` (seconds) applies to 'timeslice', `preempt_guard`
    (seconds a run must have left to be reshaped) to 'malleable'."""
    if name not in POLICIES:
        raise ValueError(f"unknown policy '{name}'; choose one of {sorted(POLICIES)}")
    if name == "timeslice" and time_slice is not None:
        return TimeslicePolicy(time_slice)
    if name == "malleable" and preempt_guard is not None:
        return MalleablePolicy(preempt_guard)
    return POLICIES[name]()


__all__ = ["POLICIES", "MalleablePolicy", "MarblePolicy", "MoldablePolicy", "Policy",
           "RigidPolicy", "TimeslicePolicy", "get_policy"]
