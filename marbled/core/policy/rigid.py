"""The LSF baseline ("rigid"): FIFO, each job on all GPUs of a node (or its explicit count).

No secondaries, no suspension: a job waits at the head of the queue until a
node has the GPUs it asked for, and the jobs behind it wait too.
"""

from __future__ import annotations

from marbled.core.model import Role, State
from marbled.core.policy.base import Policy, fifo_candidates, start_on, take_nodes


class WholeNodeFifo(Policy):
    name = "rigid"
    summary = "the LSF way: every job on all GPUs of a node, one after another"
    multi_node = True  # a job on K nodes takes its GPUs on each of them

    def choose(self, state: State, now: float) -> list:
        actions: list = []
        free = {name: state.free(name) for name in state.nodes_with_free_gpus()}
        for job in fifo_candidates(state, now):
            parts = take_nodes(free, job.nodes, lambda name, job=job: (
                job.demand if not job.malleable else job.fit(state.nodes[name].size) or
                job.demand))
            if parts is None:
                break  # strict FIFO: the head blocks the queue
            actions.append(start_on(job, parts, Role.PRIMARY))
        return actions
