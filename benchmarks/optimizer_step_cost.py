"""The optimizer step's cost on 2 CPU replicas: mirrorkit's pipeline against plain Keras.

The figures under "The optimizer step" on the Benchmarks page (docs: benchmarks/) come from
this script: ``python benchmarks/optimizer_step_cost.py``. One process, 2 logical CPUs, the
same ``tf.data`` input for every configuration: a 4-layer MLP of about 660k parameters (width
512, global batch 256) in float32; under ``mixed_float16``, which some CPUs compute in software
(a step of that model took over a second on 2026-12-03), the same MLP at width 128 (about 66k
parameters, global batch 128). Each configuration trains steps 11-60 of a fit (the first 10
leave out the trace), in 5 rounds that alternate between the configurations (every other round
in the reverse order), and the median step time is kept. Plain Keras runs with mirrorkit's
repairs off (``mk.compat.disable()``) on ``tf.distribute.MirroredStrategy``, where it trains as
one device: float32, and ``mixed_float16`` without an overflow. Everything on (mixed_float16,
global_clipnorm, gradient_accumulation_steps=2, fp16 compression, NaNGuard, an EMA that
overwrites the weights every 4 steps) has no plain counterpart: plain Keras fails with
accumulation and the EMA overwrite and clips each replica's own gradient, so it is given
against plain ``mixed_float16``. The collectives each step runs are counted inside the compiled
step (the strategy's cross-device reduce and batch_reduce, each time the traced step reaches
one).

Example:
```python
import subprocess, sys
# not run: it takes minutes
subprocess.run([sys.executable, "benchmarks/optimizer_step_cost.py"], check=True)
```
"""

from __future__ import annotations

import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

STEPS = 60
TIMED_FROM = 10
ROUNDS = 5
BATCH = 256


def main() -> None:
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(2)]
    )
    import keras
    import numpy as np

    import mirrorkit as mk

    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH * 8, 256)).astype("float32")
    y = rng.normal(size=(BATCH * 8, 1)).astype("float32")
    data = {
        "float32": tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH, True),
        "mixed_float16": tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(128, True),
    }
    width = {"float32": 512, "mixed_float16": 128}

    def make(policy, everything=False):
        keras.mixed_precision.set_global_policy(policy)
        try:
            model = keras.Sequential(
                [
                    keras.Input((256,)),
                    keras.layers.Dense(width[policy], activation="relu"),
                    keras.layers.Dense(width[policy], activation="relu"),
                    keras.layers.Dense(width[policy], activation="relu"),
                    keras.layers.Dense(1, dtype="float32"),
                ]
            )
            extra = {}
            if everything:
                extra = dict(
                    global_clipnorm=1.0,
                    gradient_accumulation_steps=2,
                    use_ema=True,
                    ema_overwrite_frequency=4,
                )
            model.compile(optimizer=keras.optimizers.AdamW(1e-4, **extra), loss="mse")
        finally:
            keras.mixed_precision.set_global_policy("float32")
        return model

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == TIMED_FROM:
                self.start = time.perf_counter()
            self.end = time.perf_counter()

    def counter_on(strategy):
        """A variable the traced step increments at each collective it runs."""
        ops = strategy.extended._cross_device_ops
        counter = tf.Variable(0, dtype=tf.int64, trainable=False)
        for name in ("reduce", "batch_reduce"):
            original = getattr(ops, name)

            def counted(*args, original=original, **kwargs):
                counter.assign_add(1)
                return original(*args, **kwargs)

            setattr(ops, name, counted)
        return counter

    plain_strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
    plain_count = counter_on(plain_strategy)
    mk_strategy = mk.strategy(cpu_replicas=2)
    mk_count = counter_on(mk_strategy)

    configs = {}
    mk.compat.disable()
    for name, policy in (("plain float32", "float32"), ("plain mixed_float16", "mixed_float16")):
        with plain_strategy.scope():
            configs[name] = (make(policy), False, [], plain_count, policy)
    mk.compat.enable(mk_strategy)
    configs["mirrorkit float32"] = (
        mk.build(lambda: make("float32"), mk_strategy),
        True,
        [],
        mk_count,
        "float32",
    )
    configs["mirrorkit mixed_float16"] = (
        mk.build(lambda: make("mixed_float16"), mk_strategy),
        True,
        [],
        mk_count,
        "mixed_float16",
    )
    everything = mk.build(
        lambda: make("mixed_float16", everything=True), mk_strategy, gradient_compression="fp16"
    )
    configs["mirrorkit, everything on"] = (
        everything,
        True,
        [mk.callbacks.NaNGuard()],
        mk_count,
        "mixed_float16",
    )

    times = {name: [] for name in configs}
    collectives = {}
    for round_index in range(ROUNDS):
        # every other round in the reverse order: a machine that slows down or speeds up
        # during a round favours neither side
        order = list(configs.items())
        for name, (model, repaired, callbacks, counter, policy) in (
            order if round_index % 2 == 0 else order[::-1]
        ):
            if repaired:
                mk.compat.enable(mk_strategy)
            else:
                mk.compat.disable()
            clock = Clock()
            before = int(counter.numpy())
            model.fit(
                data[policy],
                epochs=1,
                steps_per_epoch=STEPS,
                verbose=0,
                callbacks=[*callbacks, clock],
            )
            collectives[name] = (int(counter.numpy()) - before) / STEPS
            times[name].append((clock.end - clock.start) / (STEPS - 1 - TIMED_FROM))
    mk.compat.enable(mk_strategy)

    median = {name: statistics.median(values) for name, values in times.items()}
    versus = {
        "mirrorkit float32": "plain float32",
        "mirrorkit mixed_float16": "plain mixed_float16",
        "mirrorkit, everything on": "plain mixed_float16",
    }
    sizes = {
        policy: sum(int(np.prod(w.shape)) for w in configs[f"plain {policy}"][0].weights)
        for policy in ("float32", "mixed_float16")
    }
    print(
        f"2 CPU replicas, {ROUNDS} rounds; float32: {sizes['float32']} parameters, global batch "
        f"{BATCH}; mixed_float16: {sizes['mixed_float16']} parameters, global batch 128"
    )
    print("| step | ms per step | against plain Keras | collectives per step |")
    print("| --- | --- | --- | --- |")
    for name, value in median.items():
        ratio = f"{value / median[versus[name]]:.3f}" if name in versus else "-"
        print(f"| {name} | {value * 1e3:.2f} | {ratio} | {collectives[name]:.2f} |")


if __name__ == "__main__":
    main()
