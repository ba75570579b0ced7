"""Scheduling policies: pure functions of the state, shared by the daemon and the simulator.

A new policy is one module here with a `Policy` subclass (`base.py` says what it
declares) and one line in `POLICIES`; the CLIs, the daemon and the simulator take
its name, summary and options from the class.
"""

from marbled.core.policy.adaptive import AdaptivePolicy
from marbled.core.policy.base import Option, Policy
from marbled.core.policy.elastic import ElasticPolicy
from marbled.core.policy.learned import LearnedPolicy
from marbled.core.policy.malleable import MalleableEquipartition
from marbled.core.policy.marble import MarblePolicy
from marbled.core.policy.moldable import MoldableEquipartition
from marbled.core.policy.rigid import WholeNodeFifo
from marbled.core.policy.timeslice import TimeslicePolicy
from marbled.core.policy.whatif import WhatIfPolicy

POLICIES: dict[str, type[Policy]] = {p.name: p for p in (
    AdaptivePolicy, ElasticPolicy, LearnedPolicy, MalleableEquipartition, MarblePolicy,
    MoldableEquipartition, WholeNodeFifo, TimeslicePolicy, WhatIfPolicy)}


def get_policy(name: str, **settings: float | None) -> Policy:
    """A policy by name, with the settings it declares (others, and None, are ignored: the
    CLIs pass every policy's options to whichever policy is chosen)."""
    if name not in POLICIES:
        raise ValueError(f"unknown policy '{name}'; choose one of {sorted(POLICIES)}")
    cls = POLICIES[name]
    own = {o.name for o in cls.options}
    return cls(**{k: v for k, v in settings.items() if k in own and v is not None})


def all_options() -> dict[str, tuple[Option, list[str]]]:
    """Every option of every policy, by name, with the policies that take it."""
    out: dict[str, tuple[Option, list[str]]] = {}
    for name, cls in sorted(POLICIES.items()):
        for option in cls.options:
            out.setdefault(option.name, (option, []))[1].append(name)
    return out


__all__ = ["POLICIES", "AdaptivePolicy", "ElasticPolicy", "LearnedPolicy",
           "MalleableEquipartition", "MarblePolicy", "MoldableEquipartition", "Option", "Policy",
           "TimeslicePolicy", "WhatIfPolicy", "WholeNodeFifo", "all_options", "get_policy"]
