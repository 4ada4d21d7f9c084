"""Workstation vision: a plain Keras image classifier on every local GPU, with MirroredStrategy.

What it shows: the smallest change from a single-device Keras script to
data-parallel training on one machine. Three lines differ from the plain Keras
version (marked ``# mirrorkit``): the strategy over every local GPU, the model
built under it, and the input split per replica. On a machine without GPUs it
simulates replicas on the CPU (``--cpu_replicas``, 2 by default here). The data
are the 1,797 UCI handwritten digits (8x8 images, CC BY 4.0) that ship inside
mirrorkit, so nothing is downloaded.

Real hardware (a workstation with several GPUs; every GPU is used)::

    python examples/workstation_vision.py --batch_size 512 --epochs 30

On a laptop::

    python examples/workstation_vision.py --cpu_replicas 4
    python examples/workstation_vision.py --smoke     # a few steps, as CI runs it
    python examples/workstation_vision.py --help      # every flag, with its help text
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
from absl import app, flags, logging  # noqa: E402

import mirrorkit as mk  # noqa: E402
from mirrorkit import flags as mk_flags  # noqa: E402
from mirrorkit.demo.data import split_digits  # noqa: E402

mk_flags.define_flags(batch_size=128)  # the data-parallel flags; --batch_size is the global batch
flags.DEFINE_integer("epochs", 15, "Passes over the training images.")
flags.DEFINE_bool("smoke", False, "Run a few steps only (CI, on CPU).")
FLAGS = flags.FLAGS


def make_model():
    model = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Rescaling(1 / 16),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dropout(0.25),
            keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(2e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def main(argv):
    del argv
    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # TensorFlow's INFO lines; --verbosity 0 shows them
    keras.utils.set_random_seed(0)
    (x_train, y_train), (x_test, y_test) = split_digits()

    strategy = mk_flags.strategy_from_flags(default_cpu_replicas=2)  # mirrorkit: every local GPU
    model = mk_flags.build_from_flags(make_model, strategy)  # mirrorkit: was model = make_model()
    train = mk_flags.distribute_from_flags((x_train, y_train), strategy, seed=0)  # mirrorkit

    throughput = mk_flags.callbacks_from_flags(warmup_steps=1 if FLAGS.smoke else 5, verbose=0)
    model.fit(
        train,
        epochs=1 if FLAGS.smoke else FLAGS.epochs,
        steps_per_epoch=3 if FLAGS.smoke else None,
        verbose=2,
        callbacks=throughput,
    )
    mk.print(throughput[0].report)
    loss, accuracy = model.evaluate(x_test, y_test, batch_size=256, verbose=0)
    mk.print(
        f"test accuracy {accuracy:.4f} (loss {loss:.4f}) on {len(y_test)} held-out digits; "
        f"{strategy.num_replicas_in_sync} replicas, global batch {train.global_batch_size}"
    )


if __name__ == "__main__":
    app.run(main)
