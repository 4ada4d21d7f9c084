"""The demo's training run: strategy, model, data, fit, evaluate.

`train` runs in a fresh process (`mirrorkit demo` starts one, so TensorFlow
can take the requested number of simulated replicas and its start-up lines
are filtered, see `mirrorkit.launcher.tf_noise`); it prints as it goes and
returns the figures.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from mirrorkit.demo import data as data_lib

#: The test accuracy `mirrorkit demo` states for the bundled digits.
DIGITS_TARGET_ACCURACY = 0.95


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    """What to train.

    Attributes:
        dataset: ``"digits"`` (bundled) or a tfds name prepared on disk.
        data_dir: tfds's data directory.
        replicas: replicas to train on; None: every GPU, else 2 CPU replicas.
        epochs: passes over the training set.
        batch_size: the global batch (all replicas together).
        learning_rate: Adam's learning rate.
        seed: seeds the weights, the shuffling and the dropout.
    """

    dataset: str = data_lib.DIGITS
    data_dir: str | None = None
    replicas: int | None = None
    epochs: int = 12
    batch_size: int = 64
    learning_rate: float = 2e-3
    seed: int = 0


def make_strategy(replicas: int | None) -> Any:
    """Every GPU when there are any (or the first `replicas`), else `replicas` CPU replicas.

    Without GPUs the default is 2 simulated CPU replicas.
    """
    import tensorflow as tf

    import mirrorkit as mk

    gpus = len(tf.config.list_physical_devices("GPU"))
    if gpus:
        if replicas is not None and replicas > gpus:
            raise ValueError(
                f"--replicas {replicas} was asked for, but this machine has {gpus} GPU(s); "
                f"use --replicas {gpus} or fewer (or hide the GPUs with CUDA_VISIBLE_DEVICES= "
                "to simulate CPU replicas)"
            )
        count = replicas or gpus
        return mk.strategy("one_device") if count == 1 else mk.strategy(num_gpus=count)
    count = 2 if replicas is None else replicas
    return mk.strategy("one_device") if count == 1 else mk.strategy(cpu_replicas=count)


def make_model(image_shape: tuple[int, ...], num_classes: int, scale: float, lr: float) -> Any:
    """A small convolutional classifier; images larger than 16x16 are pooled down first."""
    import keras
    from keras import layers

    inputs = keras.Input(image_shape)
    x = layers.Rescaling(1.0 / scale)(inputs)
    size = image_shape[0]
    while size > 16:
        x = layers.Conv2D(32, 3, padding="same", activation="relu")(x)
        x = layers.MaxPooling2D()(x)
        size //= 2
    x = layers.Conv2D(32, 3, padding="same", activation="relu")(x)
    x = layers.Conv2D(64, 3, padding="same", activation="relu")(x)
    x = layers.MaxPooling2D()(x)
    x = layers.Conv2D(64, 3, padding="same", activation="relu")(x)
    x = layers.Flatten()(x)
    x = layers.Dropout(0.3)(x)
    x = layers.Dense(128, activation="relu")(x)
    outputs = layers.Dense(num_classes)(x)
    model = keras.Model(inputs, outputs, name="demo_classifier")
    model.compile(
        optimizer=keras.optimizers.Adam(lr),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def train(config: DemoConfig) -> dict[str, Any]:
    """Trains and evaluates as `config` says; prints topology, epochs, throughput, accuracy.

    Returns:
        ``{"test_accuracy", "test_loss", "replicas", "train_seconds", "dataset",
        "target"}``; ``target`` is the stated accuracy (None for tfds data sets).
    """
    import keras

    import mirrorkit as mk

    keras.utils.set_random_seed(config.seed)
    strategy = make_strategy(config.replicas)
    print(mk.describe(strategy), flush=True)
    if config.dataset == data_lib.DIGITS:
        (x_train, y_train), (x_test, y_test) = data_lib.split_digits()
        shape, classes, scale = x_train.shape[1:], 10, 16.0
        train_data = mk.distribute(
            (x_train, y_train), strategy, global_batch_size=config.batch_size, seed=config.seed
        )
        test_data = mk.distribute(
            (x_test, y_test), strategy, global_batch_size=config.batch_size, for_eval=True
        )
        about = (
            f"UCI handwritten digits (bundled): {len(x_train)} training and {len(x_test)} "
            f"test images of 8x8"
        )
    else:
        image_set = data_lib.open_tfds(config.dataset, config.data_dir)
        shape, classes, scale = image_set.image_shape, image_set.num_classes, 255.0
        common = dict(data_dir=config.data_dir, global_batch_size=config.batch_size)
        train_data = mk.distribute(
            config.dataset, strategy, split=image_set.train_split, seed=config.seed, **common
        )
        test_data = mk.distribute(
            config.dataset, strategy, split=image_set.test_split, for_eval=True, **common
        )
        about = (
            f"tfds {config.dataset} ({image_set.train_split} / {image_set.test_split}), "
            f"{image_set.num_train} training images of {'x'.join(map(str, shape))}"
        )
    print(
        f"{about}; global batch {config.batch_size} = "
        f"{strategy.num_replicas_in_sync} replicas x "
        f"{config.batch_size // strategy.num_replicas_in_sync}",
        flush=True,
    )
    model = mk.build(lambda: make_model(shape, classes, scale, config.learning_rate), strategy)
    throughput = mk.ThroughputCallback(verbose=0)
    start = time.perf_counter()
    model.fit(train_data, epochs=config.epochs, callbacks=[throughput], verbose=2)
    seconds = time.perf_counter() - start
    print(throughput.report, flush=True)
    loss, accuracy = model.evaluate(test_data, verbose=0)
    return {
        "dataset": config.dataset,
        "test_accuracy": float(accuracy),
        "test_loss": float(loss),
        "replicas": int(strategy.num_replicas_in_sync),
        "train_seconds": seconds,
        "target": DIGITS_TARGET_ACCURACY if config.dataset == data_lib.DIGITS else None,
    }
