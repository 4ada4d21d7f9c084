# ruff: noqa: E402 - the imports follow the run's order: Keras or mirrorkit first, then devices
"""keras.io's "Distributed training with Keras 3", its DataParallel section, run as written.

Run as a script: ``python _data_parallel_guide.py OUT [--devices N] [--keras-first]
[--without-mirrorkit] [--without REPAIR] [--scope]``. The guide's lines are unchanged but for
its sizes (a 128-example dataset of global batches of 16, SGD, 3 epochs, a fixed seed), the
model's lines in a function (``--scope`` builds it inside ``data_parallel.scope()`` instead of after
``set_distribution``, ``--built-before`` before it, against the guide) and
``import mirrorkit``; ``--devices N`` splits this machine's CPU into N logical devices first
(a machine with N devices; under ``mirrorkit launch`` each worker keeps its one CPU),
``--keras-first`` imports Keras before mirrorkit, ``--without REPAIR`` takes that one repair
of mirrorkit's off once Keras is imported. Writes what one device's run must equal
to OUT (JSON; a worker writes OUT-rank.json), and what mirrorkit said on stderr.
"""

import argparse
import json
import os

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--devices", type=int, default=1)
parser.add_argument("--keras-first", action="store_true")
parser.add_argument("--without-mirrorkit", action="store_true")
parser.add_argument("--without", default="")  # mirrorkit's repair of that name taken off alone
parser.add_argument("--scope", action="store_true")  # build inside data_parallel.scope()
parser.add_argument("--built-before", action="store_true")  # build before set_distribution
args = parser.parse_args()

if args.keras_first:
    import keras  # noqa: F401
if not args.without_mirrorkit:
    import mirrorkit  # noqa: F401
import numpy as np
import tensorflow as tf

if args.devices > 1:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * args.devices
    )
import keras
from keras import layers

if args.without:  # after Keras's import, which put mirrorkit's repairs in place
    from mirrorkit.patching import catalogue

    catalogue.named(args.without).remove()

# -- the guide's DataParallel section -------------------------------------------------------
# Retrieve the local available gpu devices.
devices = keras.distribution.list_devices()  # "cpu" on this machine
data_parallel = keras.distribution.DataParallel(devices=devices)

# Or you can choose to create DataParallel with a 1D `DeviceMesh`.
mesh_1d = keras.distribution.DeviceMesh(shape=(len(devices),), axis_names=["data"], devices=devices)
data_parallel = keras.distribution.DataParallel(device_mesh=mesh_1d)

rng = np.random.default_rng(0)  # the guide: np.random.normal
inputs = rng.normal(size=(128, 28, 28, 1)).astype("float32")
labels = rng.normal(size=(128, 10)).astype("float32")
dataset = tf.data.Dataset.from_tensor_slices((inputs, labels)).batch(16)


def build_and_compile():
    # Note that all the model weights from here on are distributed.
    keras.utils.set_random_seed(1)  # not in the guide: the same initial weights in every run
    inputs = layers.Input(shape=(28, 28, 1))
    y = layers.Flatten()(inputs)
    y = layers.Dense(units=200, use_bias=False, activation="relu")(y)
    y = layers.Dropout(0.0)(y)  # the guide: 0.4; no random draws, to compare with one device
    y = layers.Dense(units=10, activation="softmax")(y)
    model = keras.Model(inputs=inputs, outputs=y)
    model.compile(loss="mse", optimizer=keras.optimizers.SGD(0.1))  # the guide: "adam"
    return model


if args.scope:  # the distribution's own scope, around the model only
    with data_parallel.scope():
        model = build_and_compile()
elif args.built_before:  # not the guide's order: the model first
    model = build_and_compile()
    keras.distribution.set_distribution(data_parallel)
else:
    # Set the global distribution.
    keras.distribution.set_distribution(data_parallel)
    model = build_and_compile()
history = model.fit(dataset, epochs=3, verbose=0)
evaluation = model.evaluate(dataset, verbose=0)
# -- end of the guide's section -------------------------------------------------------------

rank = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index")
out = args.out if rank is None else f"{args.out}-{rank}.json"
with open(out, "w") as f:
    json.dump(
        {
            "replicas": model.distribute_strategy.num_replicas_in_sync,
            "devices": devices,
            "distribution": type(keras.distribution.distribution()).__name__,
            "loss": history.history["loss"],
            "evaluation": float(evaluation),
            "iterations": int(model.optimizer.iterations.numpy()),
            "weights": [w.tolist() for w in model.get_weights()],
        },
        f,
    )
