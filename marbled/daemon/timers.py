"""The broker's deadlines known in advance: the policy's next decision, the drain ahead of the
allocation's end, the allocation's watch, GPU samples and other periodic ticks."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from marbled.daemon.clock import Timer, call_later
from marbled.daemon.gpu_samples import holders

if TYPE_CHECKING:
    from marbled.daemon.broker import Broker

log = logging.getLogger("marbled")


class Timers:
    def __init__(self, broker: Broker):
        self.broker = broker
        self._due: Timer | None = None  # the policy's next decision without an event
        self._end_timer: Timer | None = None  # the drain ahead of the allocation's end

    def start(self) -> None:
        """The allocation's end and watch, and the GPU samples (the broker adds its ticks)."""
        b = self.broker
        self.drain_at(b.config.end_time)
        if b.config.watch is not None:
            self.every(b.config.allocation_poll, lambda: b.spawn(self._watch()))
        if b.sampler:
            self.every(b.config.sample_interval, self._sample_gpus)

    def every(self, interval: float, action: Callable[[], object]) -> None:
        def tick() -> None:
            action()
            call_later(self.broker.clock, interval, tick)

        call_later(self.broker.clock, interval, tick)

    def decide_at(self, due: float | None) -> None:
        """A time-driven policy (slices, stable periods) wants to decide at `due`; one that
        names a time already past asks again after every monitor interval."""
        b = self.broker
        if self._due is not None:
            self._due.cancel()
            self._due = None
        if due is not None:
            now = b.clock.time()
            self._due = b.clock.call_at(
                due if due > now else now + b.config.monitor_interval, b.wake)

    def drain_at(self, end: float | None) -> None:
        """Drain --drain-before ahead of the allocation's end `end` (None: never)."""
        b = self.broker
        if self._end_timer is not None:
            self._end_timer.cancel()
            self._end_timer = None
        if end is not None:
            self._end_timer = b.clock.call_at(end - b.config.drain_before, lambda: (
                b.spawn(b.drain(f"the allocation ends at {time.ctime(end)}"))))

    async def _watch(self) -> None:
        """Read the allocation again: a limit moved (`scontrol update TimeLimit=`) moves the
        drain with it; a node out of service (DOWN, DRAIN) gets no new runs until it is back."""
        b = self.broker
        try:
            seen = await asyncio.to_thread(b.config.watch)
        except Exception as exc:  # noqa: BLE001 (Slurm busy or gone: what was read stands)
            log.debug("could not read the allocation again: %s", exc)
            return
        now = b.clock.time()
        for node in sorted(set(seen.unavailable) | set(b.state.unavailable)):
            why = seen.unavailable.get(node)
            if why != b.state.unavailable.get(node):
                log.warning("node %s: %s", node, f"{why}: no new runs there" if why
                            else "back in service")
                b.ledger.event("node-unavailable" if why else "node-available", now,
                               node=node, state=why)
                b.state.set_unavailable(node, why)
                b.wake()
        old, end = b.config.end_time, seen.end_time
        if end == old or b.draining:
            return
        b.config.end_time = end
        log.info("the allocation's end moved: %s -> %s", time.ctime(old) if old else "never",
                 time.ctime(end) if end is not None else "never (no time limit)")
        b.ledger.event("allocation-end", now, end_time=end, was=old,
                       drain_at=None if end is None else end - b.config.drain_before)
        self.drain_at(end)

    def _sample_gpus(self) -> None:
        """One NVML reading of every GPU of the broker's node, with the job holding it."""
        b = self.broker
        node = b.config.broker_node
        b.ledger.gpu_samples(b.clock.time(), node, b.sampler.sample(),
                             holders(b.state, node, b.config.nodes.get(node, ())))
