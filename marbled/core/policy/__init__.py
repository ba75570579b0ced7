"""Scheduling policies: pure functions of the state, shared by the daemon and the simulator."""

from marbled.core.policy.base import Policy
from marbled.core.policy.marble import MarblePolicy
from marbled.core.policy.moldable import MoldablePolicy
from marbled.core.policy.rigid import RigidPolicy

POLICIES: dict[str, type] = {
    "marble": MarblePolicy,
    "moldable": MoldablePolicy,
    "rigid": RigidPolicy,
}


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown policy '{name}'; choose one of {sorted(POLICIES)}") from None


__all__ = ["POLICIES", "MarblePolicy", "MoldablePolicy", "Policy", "RigidPolicy", "get_policy"]
