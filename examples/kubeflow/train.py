"""Train on Kubernetes with Kubeflow's TFJob: ``kubectl apply -f examples/kubeflow/tfjob.yaml``.

Every replica of the TFJob runs this same script. The training operator gives
each its TF_CONFIG; ``mk.strategy()`` reads it: the ``chief`` and the
``worker`` replicas make one MultiWorkerMirroredStrategy and train together,
numbered chief first; the chief writes the model to ``--model-dir`` (a volume
every replica mounts). The ``evaluator`` replica is no training worker: it
gets a strategy of its own devices, waits for the chief's model and evaluates
it on held-out data. Without TF_CONFIG it trains on one device:
``python examples/kubeflow/train.py --model-dir /tmp/mk-model``.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

GLOBAL_BATCH = 64
MODEL_FILE = "model.keras"


def make_data(seed: int):
    """Four classes of 16 features; `seed` 0 for training, 1 held out."""
    import numpy as np

    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(0).normal(scale=0.5, size=(4, 16))
    y = rng.integers(0, 4, size=1024).astype("int32")
    x = (centres[y] + rng.normal(size=(1024, 16))).astype("float32")
    return x, y


def make_model():
    import keras

    model = keras.Sequential(
        [keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(4)]
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.05),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def train(strategy, model_dir: str, epochs: int):
    """The chief and the workers: train together; the chief writes ``model_dir/model.keras``."""
    import keras

    import mirrorkit as mk

    keras.utils.set_random_seed(0)  # the same initial weights on every replica
    model = mk.build(make_model, strategy)
    data = mk.distribute(make_data(0), strategy, global_batch_size=GLOBAL_BATCH, seed=0)
    history = model.fit(data, epochs=epochs, verbose=2 if mk.is_chief() else 0)
    os.makedirs(model_dir, exist_ok=True)
    partial = os.path.join(model_dir, f"partial-{MODEL_FILE}")
    model.save(partial)  # every worker calls save; only the chief's file is kept
    if mk.is_chief():
        os.replace(partial, os.path.join(model_dir, MODEL_FILE))  # the evaluator sees it whole
    mk.print(f"trained: loss {history.history['loss'][-1]:.4f}")
    return [w.copy() for w in model.get_weights()]


def evaluate(strategy, model_dir: str, wait_s: float):
    """The evaluator: waits for the chief's model, evaluates it on held-out data."""
    import keras

    path = os.path.join(model_dir, MODEL_FILE)
    deadline = time.monotonic() + wait_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {path} after {wait_s:.0f} s: did the chief finish training?")
        time.sleep(1)
    with strategy.scope():
        model = keras.saving.load_model(path)
    loss, accuracy = model.evaluate(*make_data(1), batch_size=GLOBAL_BATCH, verbose=0)
    print(f"evaluator: held-out loss {loss:.4f}, accuracy {accuracy:.4f}", flush=True)
    return {"loss": float(loss), "accuracy": float(accuracy)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True, help="a directory every replica shares")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--wait-s", type=float, default=3600, help="evaluator: wait this long")
    args = parser.parse_args(argv)

    import mirrorkit as mk

    strategy = mk.strategy()  # MultiWorkerMirroredStrategy on the chief and the workers
    topology = mk.describe(strategy)
    mk.print(topology)
    if topology.worker_index is None:  # the evaluator: joins no training collective
        return evaluate(strategy, args.model_dir, args.wait_s)
    return train(strategy, args.model_dir, args.epochs)


if __name__ == "__main__":
    main()
