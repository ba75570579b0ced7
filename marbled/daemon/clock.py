"""The broker's clock: the time, and timers for the deadlines it knows in advance.

The daemon runs on `LoopClock` (wall-clock time, timers on the asyncio loop);
tests give the broker a clock they advance by hand, so a suspend timeout of a
minute passes in microseconds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def time(self) -> float:
        """Unix time, in seconds."""
        ...

    def call_at(self, when: float, callback: Callable[[], object]) -> Timer:
        """Call `callback` at Unix time `when` (at once if it has passed)."""
        ...


class LoopClock:
    """Wall-clock time; timers on the running asyncio loop."""

    def time(self) -> float:
        return time.time()

    def call_at(self, when: float, callback: Callable[[], object]) -> Timer:
        return asyncio.get_running_loop().call_later(max(0.0, when - time.time()), callback)


def call_later(clock: Clock, delay: float, callback: Callable[[], object]) -> Timer:
    return clock.call_at(clock.time() + delay, callback)
