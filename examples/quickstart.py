"""mirrorkit quickstart: data-parallel training on simulated CPU replicas.

Run it with ``python examples/quickstart.py``. It makes two replicas out of
this machine's CPU (on a machine with several GPUs, drop ``cpu_replicas`` and
``mk.strategy()`` uses the GPUs), trains a small classifier, and prints the
topology, the throughput per replica and the final metrics.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import mirrorkit as mk  # noqa: E402

REPLICAS = int(os.environ.get("MIRRORKIT_QUICKSTART_REPLICAS", "2"))
GLOBAL_BATCH = 64


def make_data(n=4096, seed=0):
    """Two Gaussian blobs per class in 16 dimensions: learnable in a few epochs."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, size=n)
    centers = rng.normal(scale=0.5, size=(4, 16))
    x = centers[y] + rng.normal(size=(n, 16))
    return x.astype("float32"), y.astype("int32")


def make_model():
    model = keras.Sequential(
        [
            keras.Input((16,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(4),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def main():
    keras.utils.set_random_seed(0)
    strategy = mk.strategy(cpu_replicas=REPLICAS)  # 1. the replicas
    mk.print(mk.describe(strategy))

    model = mk.build(make_model, strategy)  # 2. mirrored weights

    x, y = make_data()
    # 3. per-replica input: shuffled each epoch, split among the replicas
    train = mk.distribute((x[:3584], y[:3584]), strategy, global_batch_size=GLOBAL_BATCH, seed=0)
    test = mk.distribute(
        (x[3584:], y[3584:]), strategy, global_batch_size=GLOBAL_BATCH, for_eval=True
    )

    throughput = mk.ThroughputCallback(warmup_steps=5, verbose=0)
    model.fit(train, epochs=5, verbose=2, callbacks=[throughput])
    mk.print(throughput.report)
    loss, accuracy = model.evaluate(test, verbose=0)
    mk.print(
        f"final: test loss {loss:.4f}, test accuracy {accuracy:.4f} "
        f"({strategy.num_replicas_in_sync} replicas, global batch {GLOBAL_BATCH})"
    )


if __name__ == "__main__":
    main()
