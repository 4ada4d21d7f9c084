"""Ray Train: a Keras 3 model through mirrorkit under ``TensorflowTrainer``, on 2 workers.

Run it with ``python examples/ray_train.py`` after ``pip install "mirrorkit[ray]"``.
It starts a local Ray cluster (or joins the one ``RAY_ADDRESS`` names), and
Ray's ``TensorflowTrainer`` starts 2 workers, gives each its ``TF_CONFIG`` and
calls `train_func` in each. Inside it, the usual three mirrorkit lines:
``mk.strategy()`` reads ``TF_CONFIG`` and makes a MultiWorkerMirroredStrategy,
``mk.build`` creates the model under it, ``mk.distribute`` gives each worker
its share of every global batch. Every epoch's averaged loss and accuracy go
to Ray through ``ray.train.report``; both workers end with the same weights,
equal to one device's on the same global batches (tests/test_ray.py).

Ray also sets ``TF_USE_LEGACY_KERAS=1`` in each worker (Ray's own TensorFlow
examples use Keras 2); mirrorkit keeps Keras 3 and says so once, on the chief.
Plain Keras 3 ``fit`` under Ray's MultiWorkerMirroredStrategy fails with
"Attempt to convert a value (PerReplica: ...) to a Tensor" (ray-project/ray#47464);
mirrorkit's Keras repairs are what make it train (docs: compat/).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

NUM_WORKERS = 2
GLOBAL_BATCH = 64
EPOCHS = 3
SEED = 0


def make_data(n=2048, seed=SEED):
    """Four Gaussian blobs in 16 dimensions: a classifier learns them in a few epochs."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, size=n)
    x = rng.normal(scale=0.5, size=(4, 16))[y] + rng.normal(size=(n, 16))
    return x.astype("float32"), y.astype("int32")


def make_model():
    import keras

    model = keras.Sequential(
        [keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(4)]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def fit(strategy, epochs=EPOCHS, callbacks=()):
    """Builds, feeds and trains the model on `strategy`; returns (model, history)."""
    import keras

    import mirrorkit as mk

    keras.utils.set_random_seed(SEED)  # the same initial weights on every worker
    model = mk.build(make_model, strategy)
    x, y = make_data()
    data = mk.distribute((x, y), strategy, global_batch_size=GLOBAL_BATCH, seed=SEED)
    history = model.fit(data, epochs=epochs, verbose=0, callbacks=list(callbacks))
    return model, history


def train_func(config):
    """What each Ray worker runs: mirrorkit's three lines, reporting each epoch to Ray.

    Args:
        config: Ray's ``train_loop_config``: ``epochs`` (default 3), and
            ``weights_dir``, where each worker then writes its final weights
            as ``worker-<rank>.npz`` (tests/test_ray.py compares them).
    """
    import keras
    import ray.train

    import mirrorkit as mk

    class ReportToRay(keras.callbacks.Callback):
        """Every worker reports each epoch's logs (averaged over the workers by mirrorkit)."""

        def on_epoch_end(self, epoch, logs=None):
            ray.train.report({"epoch": epoch + 1, **{k: float(v) for k, v in logs.items()}})

    strategy = mk.strategy()  # reads the TF_CONFIG Ray set: MultiWorkerMirroredStrategy
    mk.print(mk.describe(strategy))
    model, history = fit(strategy, config.get("epochs", EPOCHS), [ReportToRay()])
    mk.print(
        f"final: loss {history.history['loss'][-1]:.4f}, "
        f"accuracy {history.history['accuracy'][-1]:.4f}"
    )
    if config.get("weights_dir"):
        rank = ray.train.get_context().get_world_rank()
        path = os.path.join(config["weights_dir"], f"worker-{rank}.npz")
        np.savez(path, *model.get_weights())


def main():
    from ray.train import RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    trainer = TensorflowTrainer(
        train_func,
        train_loop_config={"epochs": EPOCHS},
        scaling_config=ScalingConfig(num_workers=NUM_WORKERS, use_gpu=False),
        run_config=RunConfig(name="mirrorkit-ray-train"),
    )
    result = trainer.fit()
    print(f"Ray Train finished: {result.path}")
    if result.error is not None:
        raise result.error


if __name__ == "__main__":
    main()
