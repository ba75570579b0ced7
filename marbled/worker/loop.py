"""One training run under the protocol, as one object and one loop. Standard library only.

    run = Suspendable(model, optimizer)     # the framework's subclass (torch, tf)
    for step in run.steps():                # from the step after the restored one
        train_one_step(step)                # at each step boundary: suspend if asked
    # run.finish() is called when the loop ends (or `with Suspendable(...) as run:`)

`StepLoop` is what every framework shares: it installs the protocol if the job has
not, lets a prestarted process wait for its GPUs, restores the newest checkpoint,
checkpoints, acknowledges and exits when the broker asked for a suspension (also
one asked during start-up), and saves and reports the last step at the end. A
framework (or a job with a checkpoint format of its own) gives it the checkpoint:
an object with `restore() -> step`, `save(step)` and `saved_step`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from marbled.worker.protocol import JobProtocol


class Checkpoint(Protocol):
    saved_step: int | None  # the step whose checkpoint is on disk

    def restore(self) -> int: ...  # the newest checkpoint loaded; its step (0: none)

    def save(self, step: int) -> object: ...


class StepLoop:
    def __init__(self, checkpoint: Checkpoint, *, steps: int | None = None,
                 protocol: JobProtocol | None = None, fast_exit: bool = True,
                 prestart: bool = True, every: int = 0):
        """`steps`: the step to end at (default: MARBLE_TARGET_STEPS; none: until the loop
        is left). `prestart`: the process may be started before its GPUs are free; it
        then waits here for them, so nothing before this may hold a GPU. `every`: also
        checkpoint every that many steps (0: only when suspended and at the end)."""
        if every < 0 or (steps is not None and steps < 0):
            raise ValueError("steps and every must be >= 0")
        self.checkpoint = checkpoint
        self.protocol = protocol or JobProtocol.current()
        self.fast_exit = fast_exit
        self.every = every
        for phase in ("imported", "built"):  # at the latest (kept if the job marked them)
            self.protocol.mark(phase)
        if prestart:
            self.protocol.ready()
        self.step = self.start = self.restore()
        self.protocol.restored(self.step)  # the broker learns where this run began
        self.target = steps if steps is not None else self.protocol.target_steps
        if self.suspend_agreed():  # asked while the job was starting up
            self.checkpoint_and_exit()

    # -- the checkpoint's part

    @property
    def saved_step(self) -> int | None:
        return self.checkpoint.saved_step

    def restore(self) -> int:
        return self.checkpoint.restore()

    def save(self, step: int) -> object:
        return self.checkpoint.save(step)

    # -- the loop

    @property
    def done(self) -> bool:
        return self.target is not None and self.step >= self.target

    def steps(self) -> Iterator[int]:
        """The steps to train (1-based, global across runs), in order; the run suspends
        between two of them when the broker asks, and finishes after the last."""
        while not self.done:
            yield self.step + 1
            self.step_done()
        self.finish()

    def step_done(self) -> None:
        """One more step trained: checkpoint if due, report, suspend if the broker asked."""
        self.step += 1
        if self.every and self.step % self.every == 0:
            self.save(self.step)
        self.protocol.mark("first_step")
        self.protocol.report(self.step)
        if self.suspend_agreed():
            self.checkpoint_and_exit()

    def suspend_agreed(self) -> bool:
        """Whether to suspend at this boundary: the broker asked. A job of several processes
        overrides it so that every process stops at the same step (torch DDP)."""
        return self.protocol.suspend_requested

    def checkpoint_and_exit(self) -> None:
        """Suspend now: save the step (unless saved), acknowledge, exit."""
        self.protocol.checkpoint_and_exit(self.step, self.save, self.saved_step,
                                          self.fast_exit)

    def finish(self) -> None:
        """The last step saved (unless it is) and reported."""
        if self.saved_step != self.step:
            self.save(self.step)
        self.protocol.report(self.step, force=True)

    def __enter__(self) -> StepLoop:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            self.finish()
