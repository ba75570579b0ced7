"""Clients that wait for every job to end (`GET /v1/wait`, `marble wait`).

A waiter is answered in the round of the loop in which the last job ends, not at its next
poll, and costs nothing while it waits. `marble wait` used to poll `GET /v1/jobs` (every
job ever) at each --interval: with 20,000 jobs, 0.34-0.35 s of the broker's CPU a poll,
and a batch script (--interval 30) went on up to 30 s after its last job
(benchmarks/wait_cost.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class EndWaiters:
    def __init__(self, unfinished: Callable[[], int], commit: Callable[[], None]):
        """`unfinished()`: how many jobs have not ended; `commit()`: write what waits to the
        store, so that an answer 'every job ended' finds their ends recorded."""
        self._unfinished, self._commit = unfinished, commit
        self._waiting: list[asyncio.Future] = []
        self.closed = False  # the broker drains: every wait is answered at once

    async def wait(self, timeout: float) -> bool:
        """Whether every job has ended, within `timeout` seconds (0: as it is now)."""
        if self._unfinished() and timeout > 0 and not self.closed:
            future = asyncio.get_running_loop().create_future()
            self._waiting.append(future)
            try:
                await asyncio.wait_for(future, timeout)
            except TimeoutError:
                pass
            finally:
                if future in self._waiting:
                    self._waiting.remove(future)
        if self._unfinished():
            return False
        self._commit()
        return True

    def check(self) -> None:
        """After a round of the loop: wake the waiters once no job is left unfinished."""
        if self._waiting and not self._unfinished():
            self._wake_all()

    def close(self) -> None:
        """The broker drains: no wait may hold its stop (the server waits for its
        requests), so every waiter is answered now, and later ones at once."""
        self.closed = True
        self._wake_all()

    def _wake_all(self) -> None:
        waiting, self._waiting = self._waiting, []
        for future in waiting:
            if not future.done():
                future.set_result(None)
