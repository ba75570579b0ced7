"""Suspend/resume for Keras `model.fit()` (Keras 3 on TensorFlow) as one callback.

Usage (the job's FIRST lines install the protocol)::

    from marbled.worker.protocol import JobProtocol
    PROTO = JobProtocol.from_env().install()          # before importing TensorFlow
    import keras
    from marbled.worker.keras import MarbleCallback
    from marbled.worker.tf import strategy_for_run

    with strategy_for_run(PROTO).scope():
        model = build(); model.compile(optimizer="adam", loss=...)
        marble = MarbleCallback(model, PROTO)          # restores the latest checkpoint
    start = marble.initial_step
    model.fit(dataset_from_step(start), steps_per_epoch=target - start, epochs=1,
              callbacks=[marble])
    marble.save_final()

After every batch the callback counts the global step and reports progress; when
the broker asks for a suspension it saves model, optimizer and step, acknowledges
and ends the process from inside the callback (no slow teardown). `fit()` has no
"initial step": feed it data from `initial_step` on. With `steps_per_execution=N`
callbacks run every N steps, so a suspension waits up to N steps. Keras' own
`logs["loss"]` is the running mean since `fit()` started and restarts at a resume.
"""

from __future__ import annotations

import keras

from marbled.worker.protocol import JobProtocol
from marbled.worker.tf import TFCheckpoint


class MarbleCallback(keras.callbacks.Callback):
    def __init__(self, model: keras.Model, protocol: JobProtocol | None = None, *,
                 directory=None, keep: int = 3, fast_exit: bool = True):
        super().__init__()
        self.checkpoint = TFCheckpoint(protocol, directory=directory, keep=keep,
                                       fast_exit=fast_exit, model=model,
                                       optimizer=model.optimizer)
        self.protocol = self.checkpoint.protocol
        self.initial_step = self.checkpoint.restore()
        self.step = self.initial_step

    def remaining(self, total: int) -> int:
        return max(total - self.initial_step, 0)

    def on_train_batch_end(self, batch, logs=None) -> None:
        self.step += 1
        self.checkpoint.step_finished(self.step)

    def save_final(self) -> None:
        """Save the last step (unless saved already) and report it."""
        if self.checkpoint.saved_step != self.step:
            self.checkpoint.save(self.step)
        self.protocol.report(self.step, force=True)
