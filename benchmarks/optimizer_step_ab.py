"""mirrorkit's optimizer step against plain Keras's, A/B in one process, alternating order.

Where ``benchmarks/optimizer_step_cost.py`` cannot tell a few percent apart (at a 4 ms step
its runs spread 0.93-1.08 on the shared 2-core machine), this script compares only the two
mixed-precision (and float32) steps, with more alternations: ``python
benchmarks/optimizer_step_ab.py``. The same MLP as that script's mixed-precision one (width
128, global batch 128, AdamW) on 2 CPU replicas, plain Keras on
``tf.distribute.MirroredStrategy`` with mirrorkit's repairs off, mirrorkit's built by
``mk.build``. Two measurements, each the median over rounds that alternate which side goes
first:

- **compiled step**: Keras's ``model.train_function`` called 200 times on its distributed
  iterator, 12 rounds: the traced step alone, without ``fit``'s Python around it;
- **fit**: steps 11-200 of a ``fit``, 10 rounds, with the repairs switched on and off as each
  side's fit starts (as ``optimizer_step_cost.py`` does).

Example:
```python
import subprocess, sys
# not run: it takes minutes
subprocess.run([sys.executable, "benchmarks/optimizer_step_ab.py"], check=True)
```
"""

from __future__ import annotations

import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

CALLS, CALL_ROUNDS = 200, 12
FIT_STEPS, FIT_ROUNDS, TIMED_FROM = 200, 10, 10


def main() -> None:
    import numpy as np
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras

    import mirrorkit as mk

    rng = np.random.default_rng(0)
    x = rng.normal(size=(1024, 256)).astype("float32")
    y = rng.normal(size=(1024, 1)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(128, True)

    def make(policy):
        keras.mixed_precision.set_global_policy(policy)
        try:
            hidden = [keras.layers.Dense(128, activation="relu") for _ in range(3)]
            model = keras.Sequential(
                [keras.Input((256,)), *hidden, keras.layers.Dense(1, dtype="float32")]
            )
            model.compile(optimizer=keras.optimizers.AdamW(1e-4), loss="mse")
        finally:
            keras.mixed_precision.set_global_policy("float32")
        return model

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == TIMED_FROM:
                self.start = time.perf_counter()
            self.end = time.perf_counter()

    plain_strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
    mk_strategy = mk.strategy(cpu_replicas=2)
    print("| policy | measured | mirrorkit ms | plain Keras ms | mirrorkit / plain |")
    print("| --- | --- | --- | --- | --- |")
    for policy in ("mixed_float16", "float32"):
        mk.compat.disable()
        with plain_strategy.scope():
            plain = make(policy)
        plain.fit(data, steps_per_epoch=5, verbose=0)  # traces plain Keras's step
        mk.compat.enable(mk_strategy)
        mirrored = mk.build(lambda policy=policy: make(policy), mk_strategy)
        mirrored.fit(data, steps_per_epoch=5, verbose=0)
        sides = {
            "mirrorkit": (mirrored, iter(mk_strategy.experimental_distribute_dataset(data))),
            "plain Keras": (plain, iter(plain_strategy.experimental_distribute_dataset(data))),
        }
        calls = {name: [] for name in sides}
        for round_index in range(CALL_ROUNDS):
            names = list(sides) if round_index % 2 == 0 else list(sides)[::-1]
            for name in names:
                model, iterator = sides[name]
                start = time.perf_counter()
                for _ in range(CALLS):
                    model.train_function(iterator)
                calls[name].append((time.perf_counter() - start) / CALLS)
        fits = {name: [] for name in sides}
        for round_index in range(FIT_ROUNDS):
            names = list(sides) if round_index % 2 == 0 else list(sides)[::-1]
            for name in names:
                if name == "mirrorkit":
                    mk.compat.enable(mk_strategy)
                else:
                    mk.compat.disable()
                clock = Clock()
                sides[name][0].fit(data, steps_per_epoch=FIT_STEPS, verbose=0, callbacks=[clock])
                fits[name].append((clock.end - clock.start) / (FIT_STEPS - 1 - TIMED_FROM))
        mk.compat.enable(mk_strategy)
        for measured, times in (("compiled step", calls), ("fit", fits)):
            ours, theirs = (statistics.median(times[n]) for n in ("mirrorkit", "plain Keras"))
            print(
                f"| {policy} | {measured} | {ours * 1e3:.2f} | {theirs * 1e3:.2f} | "
                f"{ours / theirs:.3f} |"
            )


if __name__ == "__main__":
    main()
