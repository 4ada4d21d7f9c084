"""NaNGuard overhead and ReplicaSyncCheck cost on 2 CPU replicas (a 3-layer MLP, 200k parameters).

The figures on the Guards page (docs: guards/) come from this script:
``python benchmarks/guards_cost.py``.
Steps 11-99 of one epoch are timed, with and without the guard, twice each, alternating.
"""

import statistics
import time

import keras
import numpy as np

import mirrorkit as mk

strategy = mk.strategy(cpu_replicas=2)
rng = np.random.default_rng(0)
x = rng.normal(size=(64 * 100, 256)).astype("float32")
y = rng.normal(size=(64 * 100, 1)).astype("float32")


def make():
    m = keras.Sequential(
        [
            keras.Input((256,)),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    m.compile(optimizer="adam", loss="mse")
    return m


class Clock(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 10:
            self.start = time.perf_counter()
        self.end = time.perf_counter()
        self.steps = batch - 10


def epoch_time(callbacks):
    model = mk.build(make, strategy)
    data = mk.distribute((x, y), strategy, global_batch_size=64, seed=0)
    clock = Clock()
    model.fit(data, epochs=1, verbose=0, callbacks=callbacks() + [clock])  # steps 11-99 timed
    return (clock.end - clock.start) / clock.steps


plain, guarded = [], []
for _ in range(2):
    plain.append(epoch_time(lambda: []))
    guarded.append(epoch_time(lambda: [mk.callbacks.NaNGuard()]))
print(
    f"step ms: plain {statistics.median(plain) * 1e3:.2f}, "
    f"NaNGuard {statistics.median(guarded) * 1e3:.2f}, "
    f"ratio {statistics.median(guarded) / statistics.median(plain):.3f}"
)
check = mk.callbacks.ReplicaSyncCheck(every_n_steps=10)
model = mk.build(make, strategy)
model.fit(
    mk.distribute((x, y), strategy, global_batch_size=64, seed=0),
    epochs=1,
    verbose=0,
    callbacks=[check],
)
n = sum(v.numpy().size for v in model.weights) + sum(
    v.numpy().size for v in model.optimizer.variables
)
print(
    f"ReplicaSyncCheck: {len(check.costs_s)} checks over {n} values; "
    f"first (traces) {check.costs_s[0] * 1e3:.1f} ms, "
    f"median of the rest {statistics.median(check.costs_s[1:]) * 1e3:.2f} ms"
)
