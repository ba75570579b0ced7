"""Suspend/resume for TensorFlow training: a run object, checkpoints, the strategy.

Usage in a custom training loop, one object and one loop::

    import tensorflow as tf
    from marbled.worker.tf import Suspendable, strategy_for_run

    strategy = strategy_for_run()                      # this run's GPUs (waits for them)
    with strategy.scope():
        model, optimizer = build()
        run = Suspendable(model, optimizer)            # restores the newest checkpoint
    for step in run.steps():                           # from the step after it
        train_step(batch_for(step))                    # suspends between steps when asked

(Keras `fit()`: `marbled.worker.keras.MarbleCallback`.) The lower-level piece is
`TFCheckpoint` (`restore()`, `save(step)`, `step_finished(step)`). A checkpoint
written under N replicas restores under M: TensorFlow saves one copy of each
mirrored variable. Only jobs import this module, never the broker.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import tensorflow as tf

from marbled.worker.loop import StepLoop
from marbled.worker.protocol import JobProtocol, fsync_dir


def strategy_for_run(protocol: JobProtocol | None = None) -> tf.distribute.Strategy:
    """A MirroredStrategy over this run's devices (the default strategy for one).

    On real GPUs that is every visible GPU. On a machine without GPUs, where the
    broker hands out emulated GPU ids, the CPU is split into as many logical
    devices as the run has GPUs, so the job trains with the same replica count
    as it would on GPUs (functionally; two logical CPUs are not faster than one).
    Call it before TensorFlow creates any tensor: it is the job's first touch of a
    GPU, so a process the broker started ahead of time waits here for its GPUs.
    """
    protocol = protocol or JobProtocol.current()
    protocol.ready()
    replicas = max(protocol.gpus, 1)
    if tf.config.list_physical_devices("GPU"):
        return tf.distribute.MirroredStrategy() if replicas > 1 else tf.distribute.get_strategy()
    if replicas == 1:
        return tf.distribute.get_strategy()
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(replicas)])
    return tf.distribute.MirroredStrategy(
        devices=[f"/cpu:{i}" for i in range(replicas)],
        cross_device_ops=tf.distribute.ReductionToOneDevice())


class TFCheckpoint:
    """Model, optimizer (and anything trackable) plus the step, in a CheckpointManager.

    Create it inside `strategy.scope()`: if an `optimizer` and a `model` are given,
    the optimizer's slots are built first, so that the restore can be checked
    to have matched every variable.
    """

    def __init__(self, protocol: JobProtocol | None = None, *, directory: Path | None = None,
                 keep: int = 3, fast_exit: bool = True, **trackables):
        self.protocol = protocol or JobProtocol.current()
        self.directory = Path(directory or self.protocol.checkpoint_dir)
        self.fast_exit = fast_exit
        model, optimizer = trackables.get("model"), trackables.get("optimizer")
        if model is not None and optimizer is not None and not getattr(optimizer, "built", True):
            optimizer.build(model.trainable_variables)
        self.step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="marble_step")
        self.checkpoint = tf.train.Checkpoint(marble_step=self.step_var, **trackables)
        self.manager = tf.train.CheckpointManager(self.checkpoint, str(self.directory),
                                                  max_to_keep=keep)
        self.saved_step: int | None = None

    def restore(self) -> int:
        """Restore the newest checkpoint that reads cleanly; returns its step (0 if none)."""
        step = 0
        for path in reversed(self.manager.checkpoints):
            try:
                self.checkpoint.restore(path).assert_existing_objects_matched()
            except (tf.errors.OpError, ValueError, AssertionError) as exc:
                print(f"marbled: checkpoint {path} is unusable ({type(exc).__name__}); "
                      "trying the previous one", file=sys.stderr)
                continue
            step = self.saved_step = int(self.step_var.numpy())
            break
        self.protocol.restored(step)
        return step

    def save(self, step: int) -> str:
        """Save at `step` and make it durable (TensorFlow itself does not fsync)."""
        self.step_var.assign(step)
        path = self.manager.save(checkpoint_number=step)
        for name in os.listdir(self.directory):
            if name.startswith(os.path.basename(path)) or name == "checkpoint":
                with open(self.directory / name, "rb") as f:
                    os.fsync(f.fileno())
        fsync_dir(self.directory)
        self.saved_step = step
        return path

    def step_finished(self, step: int) -> None:
        """Call after every training step: suspends (checkpoint, ack, exit) when asked."""
        self.protocol.step_finished(step, self.save, self.saved_step, self.fast_exit)


class Suspendable(StepLoop):
    """A TensorFlow training run: `run = Suspendable(model, optimizer)` inside the
    strategy's scope, then `for step in run.steps(): ...` (see the module's docstring).

    Further trackables to checkpoint go as keywords. `prestart`: the process may be
    started before its GPUs are free and wait for them here (`strategy_for_run` already
    does, before TensorFlow takes a GPU). `steps`, `every`, `directory`, `keep` and
    `fast_exit` as for StepLoop and TFCheckpoint."""

    def __init__(self, model, optimizer, *, steps: int | None = None, every: int = 0,
                 protocol: JobProtocol | None = None, directory: Path | None = None,
                 keep: int = 3, fast_exit: bool = True, prestart: bool = False,
                 **trackables):
        checkpoint = TFCheckpoint(protocol, directory=directory, keep=keep,
                                  fast_exit=fast_exit, model=model, optimizer=optimizer,
                                  **trackables)
        super().__init__(checkpoint, steps=steps, protocol=checkpoint.protocol,
                         fast_exit=fast_exit, prestart=prestart, every=every)
