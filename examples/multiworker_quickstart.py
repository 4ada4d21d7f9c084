"""Multi-worker quickstart: run with ``mirrorkit launch -n 2 examples/multiworker_quickstart.py``.

Each worker runs this same script. ``mirrorkit launch`` gives each its
TF_CONFIG, so ``mk.strategy()`` makes a MultiWorkerMirroredStrategy over
TensorFlow's collective runtime; Keras's ``fit`` splits each global batch
between the workers, and every worker ends with the same weights. Only the
chief prints.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import mirrorkit as mk  # noqa: E402

GLOBAL_BATCH = 64


def make_model():
    model = keras.Sequential(
        [keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(4)]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def main():
    keras.utils.set_random_seed(0)
    strategy = mk.strategy()  # MultiWorkerMirroredStrategy under `mirrorkit launch`
    mk.print(mk.describe(strategy))
    model = mk.build(make_model, strategy)

    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, size=2048).astype("int32")
    x = (rng.normal(scale=0.5, size=(4, 16))[y] + rng.normal(size=(2048, 16))).astype("float32")
    # Each worker takes its share of every global batch; the shuffle seed is shared.
    data = mk.distribute((x, y), strategy, global_batch_size=GLOBAL_BATCH, seed=0)

    throughput = mk.ThroughputCallback(warmup_steps=5)
    # Progress lines print on the chief only: mirrorkit quiets the other workers' (docs: compat/).
    history = model.fit(data, epochs=3, verbose=2, callbacks=[throughput])
    weights_sum = float(sum(np.sum(w) for w in model.get_weights()))
    print(f"worker {mk.describe().worker_index}: weight checksum {weights_sum:.6f}")
    mk.print(
        f"final: loss {history.history['loss'][-1]:.4f}, "
        f"accuracy {history.history['accuracy'][-1]:.4f}"
    )


if __name__ == "__main__":
    main()
