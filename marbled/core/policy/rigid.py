"""The LSF baseline ("rigid"): FIFO, each job on all GPUs of a node (or its explicit count).

No secondaries, no suspension: a job waits at the head of the queue until a
node has the GPUs it asked for, and the jobs behind it wait too.
"""

from __future__ import annotations

from collections.abc import Callable

from marbled.core.model import Job, Role, State
from marbled.core.policy.base import Policy, fifo_candidates, start_on, take_nodes
from marbled.core.policy.spread import take_spread


class WholeNodeFifo(Policy):
    name = "rigid"
    summary = "the LSF way: every job on all GPUs of a node, one after another"
    multi_node = True  # a job on K nodes takes its GPUs on each of them

    def choose(self, state: State, now: float) -> list:
        actions: list = []
        free = {name: state.free(name) for name in state.nodes_with_free_gpus()}
        size = {name: state.nodes[name].size for name in free}
        for job in fifo_candidates(state, now):
            if not free:
                break  # every GPU is taken: no job behind can start either
            # a node range keeps its GPUs in all, on the fewest nodes that have them
            parts = take_spread(free, job) if job.nodes_min else \
                take_nodes(free, job.nodes, _whole_node(job, size))
            if parts is None:
                break  # strict FIFO: the head blocks the queue
            actions.append(start_on(job, parts, Role.PRIMARY))
        return actions


def _whole_node(job: Job, size: dict[str, int]) -> Callable[[str], int]:
    """How many GPUs `job` takes on a node: its count, or (resizable) all the node holds
    that it can run on; worked out once per node size, not once per node."""
    if not job.malleable:
        return lambda _name: job.demand
    counts: dict[int, int] = {}

    def want(name: str) -> int:
        n = size[name]
        if n not in counts:
            counts[n] = job.fit(n) or job.demand
        return counts[n]

    return want
