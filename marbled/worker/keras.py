"""Suspend/resume for Keras `model.fit()` (Keras 3 on TensorFlow) as one callback.

Usage::

    import keras
    from marbled.worker.keras import MarbleCallback
    from marbled.worker.tf import strategy_for_run

    with strategy_for_run().scope():                   # this run's GPUs (waits for them)
        model = build(); model.compile(optimizer="adam", loss=...)
        marble = MarbleCallback(model)                 # restores the newest checkpoint
    model.fit(dataset_from_step(marble.initial_step), callbacks=[marble], ...)

After every batch the callback counts the global step and reports progress; when
the broker asks for a suspension it saves model, optimizer and step, acknowledges
and ends the process from inside the callback (no slow teardown). At the target
step (MARBLE_TARGET_STEPS, or `steps`) it stops `fit()`, and when `fit()` ends it
saves and reports the last step. `fit()` has no "initial step": feed it data from
`initial_step` on. With `steps_per_execution=N` callbacks run every N steps, so a
suspension waits up to N steps. Keras' own `logs["loss"]` is the running mean since
`fit()` started and restarts at a resume.
"""

from __future__ import annotations

import keras

from marbled.worker.loop import StepLoop
from marbled.worker.protocol import JobProtocol
from marbled.worker.tf import TFCheckpoint


class MarbleCallback(keras.callbacks.Callback):
    def __init__(self, model: keras.Model, protocol: JobProtocol | None = None, *,
                 steps: int | None = None, every: int = 0, directory=None, keep: int = 3,
                 fast_exit: bool = True):
        """Create it after `model.compile()` (inside the strategy's scope, if any)."""
        super().__init__()
        self.checkpoint = TFCheckpoint(protocol, directory=directory, keep=keep,
                                       fast_exit=fast_exit, model=model,
                                       optimizer=model.optimizer)
        self.protocol = self.checkpoint.protocol
        # the prestart wait belongs before TensorFlow takes a GPU: strategy_for_run()
        self.run = StepLoop(self.checkpoint, steps=steps, protocol=self.protocol,
                            fast_exit=fast_exit, prestart=False, every=every)
        self.initial_step = self.run.start

    @property
    def step(self) -> int:
        return self.run.step

    def remaining(self, total: int) -> int:
        return max(total - self.initial_step, 0)

    def on_train_batch_end(self, batch, logs=None) -> None:
        self.run.step_done()
        if self.run.done:
            self.model.stop_training = True

    def on_train_end(self, logs=None) -> None:
        self.run.finish()

    def save_final(self) -> None:
        """Save the last step (unless saved already) and report it (done when fit() ends)."""
        self.run.finish()
