"""Clients that wait for every job to end (`GET /v1/wait`, `marble wait`).

A waiter is answered in the round of the loop in which the last job ends, not at its next
poll, and costs nothing while it waits. `marble wait` used to poll `GET /v1/jobs` (every
job ever) at each --interval: with 20,000 jobs, 0.34-0.35 s of the broker's CPU a poll,
and a batch script (--interval 30) went on up to 30 s after its last job
(benchmarks/wait_cost.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable


class EndWaiters:
    def __init__(self, unfinished: Callable[[], int], has_ended: Callable[[int], bool],
                 commit: Callable[[], None]):
        """`unfinished()`: how many jobs have not ended; `has_ended(id)`: whether that job
        (one that exists) has. Both count a job the allocation can never hold as ended (the
        broker's `_settled`): a wait for it would last until the allocation's end.
        `commit()`: write what waits to the store, so that an answer 'ended' finds the ends
        recorded."""
        self._unfinished, self._has_ended, self._commit = unfinished, has_ended, commit
        # each waiter: its future, and the ids it waits for that have not ended (None: all)
        self._waiting: list[tuple[asyncio.Future, set[int] | None]] = []
        self.closed = False  # the broker drains: every wait is answered at once

    async def wait(self, timeout: float, jobs: Iterable[int] | None = None) -> bool:
        """Whether every job (or each of `jobs`, which exist) has ended, within `timeout`
        seconds (0: as it is now)."""
        pending = None if jobs is None else {j for j in jobs if not self._has_ended(j)}
        if not self._ended(pending) and timeout > 0 and not self.closed:
            waiter = (asyncio.get_running_loop().create_future(), pending)
            self._waiting.append(waiter)
            try:
                await asyncio.wait_for(waiter[0], timeout)
            except TimeoutError:
                pass
            finally:
                if waiter in self._waiting:
                    self._waiting.remove(waiter)
        if not self._ended(pending):
            return False
        self._commit()
        return True

    def _ended(self, pending: set[int] | None) -> bool:
        if pending is None:
            return not self._unfinished()
        pending.difference_update([j for j in pending if self._has_ended(j)])
        return not pending

    def check(self) -> None:
        """After a round of the loop: wake the waiters whose jobs have all ended."""
        if not self._waiting:
            return
        waiting, self._waiting = self._waiting, []
        for future, pending in waiting:
            if self._ended(pending):
                if not future.done():
                    future.set_result(None)
            else:
                self._waiting.append((future, pending))

    def close(self) -> None:
        """The broker drains: no wait may hold its stop (the server waits for its
        requests), so every waiter is answered now, and later ones at once."""
        self.closed = True
        waiting, self._waiting = self._waiting, []
        for future, _ in waiting:
            if not future.done():
                future.set_result(None)
