"""A ready TensorFlow training job on synthetic data, suspendable by marbled.

    marble example tf > train_tf.py    # this script, from the installed package
    python train_tf.py --arch lenet --steps 500                                 # alone
    marble submit --model lenet --steps 500 -- python train_tf.py --arch lenet  # broker

--arch lenet: LeNet-5 on MNIST-shaped input (28x28x1); --arch resnet: a small
ResNet (3 stages of 2 basic blocks, 16/32/64 channels, BatchNorm) on 32x32x3.
--mode custom: a tf.function training loop with one `Suspendable` run object;
--mode keras: model.fit with the MarbleCallback. The batch of global step s is a
pure function of s, so no input-pipeline state needs a checkpoint. Trains with
MirroredStrategy over the run's GPUs (logical CPU devices where the GPUs are
emulated); a process the broker prestarted waits for its GPUs in strategy_for_run().
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from marbled.worker.keras import MarbleCallback  # noqa: E402
from marbled.worker.tf import Suspendable, strategy_for_run  # noqa: E402

CLASSES = 10


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", choices=["lenet", "resnet"], default="lenet")
    p.add_argument("--mode", choices=["custom", "keras"], default="custom")
    p.add_argument("--steps", type=int, default=int(os.environ.get("MARBLE_TARGET_STEPS") or 200),
                   help="steps in all, across suspensions (default: MARBLE_TARGET_STEPS, "
                        "else 200)")
    p.add_argument("--batch", type=int, default=64, help="global batch size")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--loss-log", help="append 'step loss' for every completed step")
    p.add_argument("--no-fast-exit", dest="fast_exit", action="store_false",
                   help="on suspension, exit through the normal interpreter teardown "
                        "(slower; for measuring what the fast exit saves)")
    return p.parse_args()


def build_model(arch: str) -> keras.Model:
    if arch == "lenet":
        return keras.Sequential([
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(6, 5, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(16, 5, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(120, activation="relu"),
            keras.layers.Dense(84, activation="relu"),
            keras.layers.Dense(CLASSES),
        ])
    inputs = keras.Input((32, 32, 3))
    x = keras.layers.Conv2D(16, 3, padding="same", use_bias=False)(inputs)
    x = keras.layers.ReLU()(keras.layers.BatchNormalization()(x))
    for i, width in enumerate((16, 32, 64)):
        for j in range(2):
            stride = 2 if i > 0 and j == 0 else 1
            y = keras.layers.Conv2D(width, 3, stride, padding="same", use_bias=False)(x)
            y = keras.layers.ReLU()(keras.layers.BatchNormalization()(y))
            y = keras.layers.Conv2D(width, 3, padding="same", use_bias=False)(y)
            y = keras.layers.BatchNormalization()(y)
            if stride != 1 or x.shape[-1] != width:
                x = keras.layers.Conv2D(width, 1, stride, use_bias=False)(x)
            x = keras.layers.ReLU()(keras.layers.Add()([x, y]))
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(CLASSES)(x))


def batch_for_step(step, arch: str, batch: int, seed: int):
    """The batch of global step `step`: a pure function of it. Each class is a fixed noisy
    template, so the loss falls quickly and a reset to fresh weights would show."""
    shape = (28, 28, 1) if arch == "lenet" else (32, 32, 3)
    key = tf.stack([seed, tf.cast(step, tf.int32)])
    labels = tf.random.stateless_uniform((batch,), key, 0, CLASSES, dtype=tf.int32)
    templates = tf.random.stateless_normal((CLASSES, *shape), seed=[seed, -1])
    noise = tf.random.stateless_normal((batch, *shape), seed=key + 1)
    return tf.gather(templates, labels) * 0.5 + noise, labels


def dataset(start: int, args):
    return tf.data.Dataset.range(start, args.steps).map(
        lambda s: batch_for_step(s, args.arch, args.batch, args.seed))


def main() -> int:
    args = parse_args()
    strategy = strategy_for_run()  # first: it waits for the GPUs and splits the CPU
    keras.utils.set_random_seed(args.seed)
    print(f"train_tf: {args.arch}/{args.mode} on {strategy.num_replicas_in_sync} replica(s), "
          f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')}", file=sys.stderr)
    log = open(args.loss_log, "a") if args.loss_log else None  # noqa: SIM115
    loss_fn = keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="sum_over_batch_size")
    with strategy.scope():
        model = build_model(args.arch)
        optimizer = keras.optimizers.Adam(args.lr)
        if args.mode == "keras":
            model.compile(optimizer=optimizer, loss=loss_fn)
            run = MarbleCallback(model, steps=args.steps, fast_exit=args.fast_exit)
            step = run.initial_step
        else:
            run = Suspendable(model, optimizer, steps=args.steps, fast_exit=args.fast_exit)
            step = run.start
    iterations = int(optimizer.iterations.numpy())
    print(f"train_tf: restored step {step}, optimizer iterations {iterations}", file=sys.stderr)

    if args.mode == "keras":
        class LossLog(keras.callbacks.Callback):
            # Keras reports the running mean since fit() began; recover each batch's loss.
            mean = 0.0

            def on_train_batch_end(self, batch, logs=None):
                # Runs before the MarbleCallback, which may end the process at this step.
                self.last = (batch + 1) * float(logs["loss"]) - batch * self.mean
                self.mean = float(logs["loss"])
                if log:
                    log.write(f"{run.step + 1} {self.last!r}\n")
                    log.flush()

        losses = LossLog()
        losses.last = float("nan")
        if step < args.steps:
            model.fit(dataset(step, args), steps_per_epoch=args.steps - step, epochs=1,
                      verbose=0, callbacks=[losses, run])
        step, loss = run.step, losses.last
    else:
        @tf.function
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                per_example = keras.losses.sparse_categorical_crossentropy(
                    y, model(x, training=True), from_logits=True)
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=args.batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        @tf.function
        def train_step(batch):
            losses = strategy.run(replica_step, args=batch)
            return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

        loss = float("nan")
        batches = iter(strategy.experimental_distribute_dataset(dataset(step, args)))
        for step in run.steps():  # suspends between two steps when the broker asks
            loss = float(train_step(next(batches)))
            if log:
                log.write(f"{step} {loss!r}\n")
                log.flush()
        step = run.step
    print(f"train_tf: {args.arch} trained to step {step}, last loss {loss:.6f}")
    return 0


if __name__ == "__main__":
    sys.stdout.flush()
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
