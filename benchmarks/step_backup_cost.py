"""What a step backup costs: `mk.resumable(dir, every=N)` against no backup, side by side.

``python benchmarks/step_backup_cost.py`` measures, in one process:

- **a small model's fit** (an MLP of 0.53M parameters, Adam, global batch 256, 2 CPU
  replicas, fits of 2 epochs of 100 steps on one model), without a backup and with
  ``mk.resumable(dir, every=N)`` for N = 25 and 100, on local disk; 9 rounds, each round
  running the three in a rotated order; the median wall time of each, and its ratio to no
  backup; and the time of one backup of that model (median of 5), the steadier figure;
- **one backup of a large model**: the time of ``mk.resumable``'s write (the weights and
  Adam's two slots to ``latest.weights.h5``, the previous pair kept, the SHA-256) for a
  model of about ``--params`` parameters (default 100M: 1.2 GB with Adam's slots), on one
  device, median of 3; and the steps per backup that keep it under 5% of training time for
  a step of 0.1, 0.3 and 1 s.

The write blocks the step (Keras's ``BackupAndRestore`` writes from ``on_train_batch_end``).

Example:
```python
import subprocess, sys
# not run: it takes minutes
subprocess.run([sys.executable, "benchmarks/step_backup_cost.py"], check=True)
```
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

EPOCHS, STEPS, BATCH, ROUNDS = 2, 100, 256, 9


def _small_fits(settings: list, directory: str) -> dict:
    """Wall seconds of each fit, per setting: one model, fits in a rotated order each round."""
    import keras
    import numpy as np

    import mirrorkit as mk

    strategy = mk.strategy(cpu_replicas=2)

    def make():
        model = keras.Sequential(
            [
                keras.Input((256,)),
                keras.layers.Dense(1024, activation="relu"),
                keras.layers.Dense(256),
                keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer="adam", loss="mse")
        return model

    model = mk.build(make, strategy)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * BATCH, 256)).astype("float32")
    data = mk.distribute((x, x[:, :1]), strategy, global_batch_size=BATCH, seed=0)
    model.fit(data, epochs=1, verbose=0)  # traced and warm
    seconds: dict = {every: [] for every in settings}
    for round_ in range(ROUNDS):
        for every in settings[round_ % 3 :] + settings[: round_ % 3]:
            backup = os.path.join(directory, f"b{round_}-{every}")
            callbacks = [] if every is None else [mk.resumable(backup, every=every)]
            start = time.perf_counter()
            model.fit(data, epochs=EPOCHS, verbose=0, callbacks=callbacks)
            seconds[every].append(time.perf_counter() - start)
    return seconds


def _backup_seconds(
    widths: list[int], directory: str, name: str, repeats: int
) -> tuple[float, int, float]:
    """One mk.resumable backup of an MLP of `widths` with Adam: median seconds, size, GB."""
    import keras

    import mirrorkit as mk

    model = keras.Sequential(
        [keras.Input((widths[0],))] + [keras.layers.Dense(width) for width in widths[1:]]
    )
    model.compile(optimizer="adam", loss="mse")
    model.optimizer.build(model.trainable_variables)
    callback = mk.resumable(os.path.join(directory, name), every=1)
    callback.set_model(model)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        callback._save_model()
        times.append(time.perf_counter() - start)
    size = os.path.getsize(os.path.join(directory, name, "latest.weights.h5"))
    return statistics.median(times), model.count_params(), size / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=100e6, help="the large model's size")
    args = parser.parse_args()
    settings = [None, 25, 100]
    with tempfile.TemporaryDirectory(prefix="step-backup-cost-") as directory:
        seconds = _small_fits(settings, directory)
        base = statistics.median(seconds[None])
        print(f"small model, {EPOCHS * STEPS} steps on 2 CPU replicas (median of {ROUNDS}):")
        print(f"  no backup: {base:.2f} s ({base / (EPOCHS * STEPS) * 1e3:.1f} ms a step)")
        for every in settings[1:]:
            median = statistics.median(seconds[every])
            print(f"  every={every}: {median:.2f} s, {median / base:.3f} of no backup")
        small, count, _ = _backup_seconds([256, 1024, 256, 1], directory, "small", 5)
        print(
            f"  one backup of the small model ({count / 1e6:.2f}M parameters): {small * 1e3:.0f} ms"
        )
        width = 5000  # 25M parameters a layer
        layers = max(1, round(args.params / (width * width)))
        write, count, gigabytes = _backup_seconds([width] * (layers + 1), directory, "large", 3)
    print(
        f"one backup of {count / 1e6:.0f}M parameters with Adam ({gigabytes:.2f} GB): {write:.2f} s"
    )
    for step in (0.1, 0.3, 1.0):
        print(f"  at {step} s a step, under 5% from every={int(write / (0.05 * step)) + 1} steps")


if __name__ == "__main__":
    main()
