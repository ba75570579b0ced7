"""What a reader of a broker's state file needs without SQLAlchemy (`marble report` reads
it with sqlite3 alone, and a CLI process should not pay SQLAlchemy's 0.2-0.3 s import)."""

from __future__ import annotations

SCHEMA_VERSION = 9
# (A new table needs no new version: sql/schema.sql makes it at any start, and an older marbled
# leaves it alone; the requests table came so.)


def placement_parts(node: str, gpu_ids: str) -> list[tuple[str, tuple[int, ...]]]:
    """Back from the runs.node and runs.gpu_ids values to (node, GPU slots) pairs."""
    return [(n, tuple(int(g) for g in slots.split(",") if g))
            for n, slots in zip(node.split(","), gpu_ids.split(";"), strict=True)]
