"""A small, deterministic training run shared by the correctness tests.

`train_small_model` builds the same Dense + Conv model from fixed NumPy
weights, trains it on fixed data with global batch `global_batch`, and returns
the final weights and the Keras History, so that runs on different replica
counts (or workers) can be compared number by number.
"""

from __future__ import annotations

import contextlib

import numpy as np

NUM_EXAMPLES = 128
GLOBAL_BATCH = 32
NUM_CLASSES = 3


def make_data(num_examples: int = NUM_EXAMPLES, seed: int = 1):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num_examples, 6, 6, 2)).astype("float32")
    y = rng.integers(0, NUM_CLASSES, size=(num_examples,)).astype("int32")
    return x, y


def make_model(optimizer: str, learning_rate: float, accumulation=None, **compile_kwargs):
    import keras

    model = keras.Sequential(
        [
            keras.Input((6, 6, 2)),
            keras.layers.Conv2D(4, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(8, activation="tanh"),
            keras.layers.Dense(NUM_CLASSES),
        ]
    )
    opt = {"sgd": keras.optimizers.SGD, "adam": keras.optimizers.Adam}[optimizer]
    model.compile(
        optimizer=opt(learning_rate=learning_rate, gradient_accumulation_steps=accumulation),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["sparse_categorical_accuracy"],
        **compile_kwargs,
    )
    rng = np.random.default_rng(7)
    model.set_weights(
        [rng.normal(scale=0.3, size=w.shape).astype("float32") for w in model.get_weights()]
    )
    return model


def train_small_model(
    strategy, optimizer: str, learning_rate: float, epochs: int = 4, **compile_kwargs
):
    """Trains 4 steps per epoch; returns (weights, history dict)."""
    import tensorflow as tf

    import mirrorkit as mk

    x, y = make_data()
    model = mk.build(lambda: make_model(optimizer, learning_rate, **compile_kwargs), strategy)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
    history = model.fit(data, epochs=epochs, verbose=0)
    return [w.copy() for w in model.get_weights()], dict(history.history)


@contextlib.contextmanager
def keras_own_step():
    """Keras's own optimizer step and loss scaling for the block (the canaries' "Keras alone"):
    mirrorkit's `optimizer_step` and the one-device loss repairs taken off, every other repair
    kept; all back after it."""
    from mirrorkit import compat
    from mirrorkit.compat import one_device_loss, one_device_tape, optimizer_step

    for repair in (*one_device_tape.REPAIRS, *one_device_loss.REPAIRS, optimizer_step.STEP):
        repair.remove()
    try:
        yield
    finally:
        compat.enable()


LEARNING_RATES = {"sgd": 0.1, "adam": 0.01}


def train_both_optimizers(replicas: int, lr_scale: float = 1.0):
    """In a fresh process: SGD and Adam runs on `replicas` CPU replicas."""
    import mirrorkit as mk

    strategy = mk.strategy("one_device") if replicas == 1 else mk.strategy(cpu_replicas=replicas)
    assert strategy.num_replicas_in_sync == replicas
    return {
        name: train_small_model(strategy, name, lr * lr_scale)
        for name, lr in LEARNING_RATES.items()
    }
