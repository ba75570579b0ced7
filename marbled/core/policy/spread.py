"""How many nodes a multi-node job runs on: the one choice every policy that places such
jobs makes the same way.

A job asks for `nodes` nodes with `demand` GPUs on each, or for a range (`nodes_min` to
`nodes`, as Slurm's `--nodes=MIN-MAX`). Its GPU count in all is fixed at demand x nodes
(for a job with one process per GPU, its world size): a run may take any k nodes in the
range that divide that count evenly, the same number of GPUs on each, and the fewest
nodes that fit come first (less traffic between nodes, and whole nodes left to others).
A job given one count has one shape: `nodes` nodes of `demand`, as before ranges.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from marbled.core.model import Job
from marbled.core.policy.base import take_nodes
from marbled.core.shapes import shapes

T = TypeVar("T")


def first_shape(demand: int, nodes: int, nodes_min: int | None,
                fits: Callable[[int, int], T | None]) -> T | None:
    """What `fits(k, per_node)` gives for the first of the shapes it does not refuse (None),
    fewest nodes first; None if none fits."""
    for k, per_node in shapes(demand, nodes, nodes_min):
        found = fits(k, per_node)
        if found is not None:
            return found
    return None


def take_spread(free: dict[str, list[int]], job: Job) -> list[tuple[str, tuple[int, ...]]] | None:
    """`job`'s GPUs on the fewest nodes of its range that have them free, taken out of
    `free` as `take_nodes` does; None (and `free` untouched) if no shape fits."""
    return first_shape(job.demand, job.nodes, job.nodes_min,
                       lambda k, per_node: take_nodes(free, k, lambda _node: per_node))
