"""How a GPU count and a job's shape are said (pure, standard library only): one wording
for the broker's messages and for `marble`, whose fast commands (submit, status, show)
print them without importing what `core.target` computes them with (`core.learning`)."""

from __future__ import annotations

# What becomes of a queued job the allocation can never hold (`model.misfit`: a larger one
# queued it), as the broker's log, `marble explain` and `marble wait` say it
UNFIT_WAIT = ("it stays queued in the state directory for an allocation that can hold it, "
              "and the jobs behind it run meanwhile")


def gpus_text(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def shape_text(per_node: int, nodes: int = 1, nodes_min: int | None = None,
               per_gpu: bool = False) -> str:
    """A job's GPUs as `marble submit` and `marble show` say them: '2 GPUs' on one node,
    '2 GPUs on each of 2 nodes' (or 'of 1-2 nodes', a node range) on several, and for a
    per-GPU job on several its ranks too, one per GPU: '..., 4 ranks' ('2-4 ranks')."""
    fewest = nodes if nodes_min is None else nodes_min
    if nodes <= 1:
        return gpus_text(per_node)
    where = f"{nodes}" if fewest == nodes else f"{fewest}-{nodes}"
    text = f"{gpus_text(per_node)} on each of {where} nodes"
    if per_gpu:
        low, high = per_node * fewest, per_node * nodes
        text += f", {high} ranks" if low == high else f", {low}-{high} ranks"
    return text


def shapes(demand: int, nodes: int, nodes_min: int | None = None,
           node_size: int | None = None) -> list[tuple[int, int]]:
    """(node count, GPUs on each) a job of `demand` GPUs on each of `nodes` nodes (at most,
    from `nodes_min`) may run as, fewest nodes first; those over `node_size` left out."""
    total = demand * nodes
    return [(k, total // k) for k in range(nodes_min or nodes, nodes + 1)
            if total % k == 0 and (node_size is None or total // k <= node_size)]
