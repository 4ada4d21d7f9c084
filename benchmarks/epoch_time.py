"""Median epoch time, side by side: one device, raw tf.distribute, and mirrorkit, with validation.

One small model (an MLP 32-256-256-1 on 4,096 examples, global batch 128: 32 steps an epoch,
and 1,024 validation examples validated every epoch), trained for ``--epochs`` epochs in each
placement below, each in a fresh process (TensorFlow fixes its devices at first use), the
placements alternated ``--rounds`` times so that a slow minute of a shared machine falls on
all of them. An epoch's time is ``on_epoch_begin`` to ``on_epoch_end`` (validation included);
the median is over the epochs after the first (which traces the step):

- ``one device``: plain Keras, ``fit(x, y, batch_size=128, validation_data=(xv, yv))``;
- ``raw MirroredStrategy``: 2 CPU replicas, ``strategy.experimental_distribute_dataset`` of
  ``Dataset.batch(128)`` for training and validation, as TensorFlow's guides write it;
- ``mirrorkit``: the same 2 replicas through ``mk.strategy``, ``mk.distribute``;
- ``mirrorkit, an iterator per epoch``: the same with the ``one_iterator`` repair off (how
  mirrorkit ran before it: Keras makes a distributed iterator every epoch);
- with ``--workers``: the raw and the mirrorkit way on 2 local workers
  (``MultiWorkerMirroredStrategy``, one CPU replica each), through `mk.launch`; the raw
  workers call ``mirrorkit.compat.enable`` (plain Keras 3 cannot ``fit`` under that strategy),
  which also keeps one iterator per fit only for mirrorkit's own datasets.

Run it as ``python benchmarks/epoch_time.py`` (``--workers`` adds the 2-worker rows); it prints
a table and, with ``--json PATH``, writes the figures. the Benchmarks page has its tables
(docs: benchmarks/).

Example:
```python
import subprocess, sys
subprocess.run([sys.executable, "benchmarks/epoch_time.py", "--epochs", "3", "--rounds", "1"])
```
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

EXAMPLES, VALIDATION, FEATURES, BATCH = 4096, 1024, 32, 128

PLACEMENTS = {
    "one device": ("one_device", 0),
    "raw MirroredStrategy": ("raw", 2),
    "mirrorkit": ("mirrorkit", 2),
    "mirrorkit, an iterator per epoch": ("mirrorkit_per_epoch", 2),
}
WORKER_PLACEMENTS = {
    "raw MultiWorkerMirroredStrategy + compat.enable, 2 workers": "raw",
    "mirrorkit, 2 workers": "mirrorkit",
}


def _data():
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(EXAMPLES + VALIDATION, FEATURES)).astype("float32")
    y = (x[:, :4].sum(axis=1, keepdims=True) > 0).astype("float32")
    return (x[:EXAMPLES], y[:EXAMPLES]), (x[EXAMPLES:], y[EXAMPLES:])


def _model():
    import keras

    model = keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(1, activation="sigmoid"),
        ]
    )
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    return model


def _timed_fit(model, train, validation, epochs, **fit_kwargs) -> list[float]:
    import time

    import keras

    times: list[float] = []

    class EpochClock(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            times.append(time.perf_counter() - self.start)

    model.fit(
        train,
        validation_data=validation,
        epochs=epochs,
        verbose=0,
        callbacks=[EpochClock()],
        **fit_kwargs,
    )
    return times


def run_placement(way: str, replicas: int, epochs: int) -> list[float]:
    """In a fresh process (or a worker): one placement's epoch times."""
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    (x, y), (xv, yv) = _data()
    if way == "one_device":
        return _timed_fit(_model(), x, (xv, yv), epochs, y=y, batch_size=BATCH, shuffle=False)
    if way == "raw":
        if replicas:
            cpu = tf.config.list_physical_devices("CPU")[0]
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration()] * replicas
            )
            strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
        else:  # a worker of a job: TF_CONFIG says who it is
            strategy = tf.distribute.MultiWorkerMirroredStrategy()
            import mirrorkit.compat  # plain Keras 3 cannot fit under it (docs: compat/)

            mirrorkit.compat.enable(strategy)
        with strategy.scope():
            model = _model()
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.DATA
        )

        def distributed(a, b):
            batches = tf.data.Dataset.from_tensor_slices((a, b)).batch(BATCH)
            return strategy.experimental_distribute_dataset(batches.with_options(options))

        return _timed_fit(model, distributed(x, y), distributed(xv, yv), epochs)
    import mirrorkit as mk

    strategy = mk.strategy(cpu_replicas=replicas or None)
    if way == "mirrorkit_per_epoch":
        from mirrorkit.feeding import one_iterator

        for repair in reversed(one_iterator.REPAIRS):
            repair.remove()
    model = mk.build(_model, strategy)
    train = mk.distribute((x, y), strategy, global_batch_size=BATCH, shuffle=False)
    validation = mk.distribute((xv, yv), strategy, global_batch_size=BATCH, for_eval=True)
    return _timed_fit(model, train, validation, epochs)


def _median(times: list[float]) -> float:
    return statistics.median(times[1:] if len(times) > 1 else times)


def main(argv: list[str] | None = None) -> dict[str, list[float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=8, help="epochs per placement (default 8)")
    parser.add_argument("--rounds", type=int, default=2, help="alternations (default 2)")
    parser.add_argument("--workers", action="store_true", help="add the 2-worker placements")
    parser.add_argument("--json", help="write the medians and epoch times to this file")
    args = parser.parse_args(argv)

    import mirrorkit as mk
    from mirrorkit.launcher.processes import run_function

    medians: dict[str, list[float]] = {}
    epochs: dict[str, list[list[float]]] = {}
    for _ in range(args.rounds):
        for name, (way, replicas) in PLACEMENTS.items():
            times = run_function(run_placement, (way, replicas, args.epochs), timeout_s=900)[0]
            medians.setdefault(name, []).append(_median(times))
            epochs.setdefault(name, []).append(times)
        if args.workers:
            for name, way in WORKER_PLACEMENTS.items():
                times = mk.launch(run_placement, num_workers=2, args=(way, 0, args.epochs))
                medians.setdefault(name, []).append(_median(times))
                epochs.setdefault(name, []).append(times)
    raw = statistics.median(medians["raw MirroredStrategy"])
    print(f"median epoch time (s), epochs 2-{args.epochs}, {args.rounds} round(s):")
    for name, values in medians.items():
        shown = ", ".join(f"{v:.3f}" for v in values)
        ratio = statistics.median(values) / raw
        print(f"  {name:58s} {shown}   x{ratio:.2f} of raw MirroredStrategy")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"medians": medians, "epochs": epochs}, f, indent=1)
    return medians


if __name__ == "__main__":
    main(sys.argv[1:])
