"""The LSF baseline: FIFO, each job on all GPUs of a node (or its explicit count).

No secondaries, no suspension: a job waits at the head of the queue until a
node has the GPUs it asked for, and the jobs behind it wait too.
"""

from __future__ import annotations

from marbled.core.model import Role, Start, State
from marbled.core.policy.base import fifo_candidates


class RigidPolicy:
    name = "rigid"

    def decide(self, state: State, now: float = 0.0) -> list:
        actions: list = []
        free = {name: state.free(name) for name in state.nodes_with_free_gpus()}
        for job in fifo_candidates(state, actions):
            for name in free:
                node = state.nodes[name]
                want = job.demand if not job.malleable else node.size
                if want <= len(free[name]):
                    gpus, free[name] = free[name][:want], free[name][want:]
                    actions.append(Start(job.id, name, tuple(gpus), Role.PRIMARY))
                    break
            else:
                break  # strict FIFO: the head blocks the queue
        return actions

    def next_decision(self, state: State, now: float) -> float | None:
        return None  # events alone drive this policy
