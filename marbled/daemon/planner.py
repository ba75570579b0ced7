"""The process a planning policy (whatif) plans in, beside the broker's loop.

Spawned, not forked: the loop's threads (the store's writer) must not be copied mid-lock.
Its worker goes with the broker: a broker killed with SIGKILL cannot shut the pool down,
and the worker, which holds both ends of its own call queue, would wait for work forever.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor

PARENT_POLL_S = 1.0  # how often the worker looks for its broker


def plan_beside(policy, metrics) -> ProcessPoolExecutor | None:
    """The planning process of `policy`, if it plans (None otherwise); its plans and their
    CPU are shown in /metrics."""
    if not hasattr(policy, "background"):
        return None
    policy.background = ProcessPoolExecutor(
        1, mp_context=multiprocessing.get_context("spawn"), initializer=_exit_with_parent,
        initargs=(os.getpid(),))
    metrics.watch_planner(policy)
    return policy.background


def _exit_with_parent(parent: int) -> None:
    """In the worker: end it once `parent` (the broker) is gone."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(0)

    threading.Thread(target=watch, name="exit-with-broker", daemon=True).start()
