"""The benchmark models and their synthetic inputs.

Each model trains on one `synthetic_example` repeated from memory (the
benchmark's pipeline batches it per replica), so the input pipeline never
limits the measured throughput.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import keras
import tensorflow as tf

NUM_CLASSES = 10


@dataclasses.dataclass(frozen=True)
class BenchModel:
    """A benchmark model: how to build it and what its inputs look like.

    Attributes:
        name: ``mlp``, ``cnn``, ``resnet`` or ``transformer``.
        build: returns an uncompiled Keras model.
        input_shape: one example's input shape.
        input_dtype: ``float32``, or ``int32`` for token ids.
        default_batch: the default per-replica batch size.
    """

    name: str
    build: Callable[[], keras.Model]
    input_shape: tuple[int, ...]
    input_dtype: str = "float32"
    default_batch: int = 64


def _mlp() -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((784,)),
            keras.layers.Dense(512, activation="relu"),
            keras.layers.Dense(512, activation="relu"),
            keras.layers.Dense(NUM_CLASSES),
        ],
        name="mlp",
    )


def _cnn() -> keras.Model:
    """The benchmark CNN: about 1.2M parameters on 32x32x3 inputs."""
    layers = keras.layers
    return keras.Sequential(
        [
            keras.Input((32, 32, 3)),
            layers.Conv2D(32, 3, padding="same", activation="relu"),
            layers.Conv2D(32, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.Conv2D(64, 3, padding="same", activation="relu"),
            layers.Conv2D(64, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.Flatten(),
            layers.Dense(272, activation="relu"),
            layers.Dense(NUM_CLASSES),
        ],
        name="cnn",
    )


def _resnet() -> keras.Model:
    """A small ResNet: three stages of two residual blocks, 16-32-64 filters."""
    layers = keras.layers
    inputs = keras.Input((32, 32, 3))
    x = layers.Conv2D(16, 3, padding="same", use_bias=False)(inputs)
    x = layers.ReLU()(layers.BatchNormalization()(x))
    for stage, filters in enumerate((16, 32, 64)):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            shortcut = x
            y = layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False)(x)
            y = layers.ReLU()(layers.BatchNormalization()(y))
            y = layers.Conv2D(filters, 3, padding="same", use_bias=False)(y)
            y = layers.BatchNormalization()(y)
            if stride != 1 or shortcut.shape[-1] != filters:
                shortcut = layers.Conv2D(filters, 1, strides=stride, use_bias=False)(shortcut)
            x = layers.ReLU()(layers.Add()([y, shortcut]))
    outputs = layers.Dense(NUM_CLASSES)(layers.GlobalAveragePooling2D()(x))
    return keras.Model(inputs, outputs, name="resnet")


def _transformer(length: int = 64, vocab: int = 1000, width: int = 64) -> keras.Model:
    """A small encoder: token and position embeddings, two blocks of 4-head attention."""
    layers = keras.layers
    tokens = keras.Input((length,), dtype="int32")
    x = layers.Embedding(vocab, width)(tokens)
    positions = layers.Embedding(length, width)(keras.ops.arange(length)[None, :])
    x = x + positions
    for _ in range(2):
        attended = layers.MultiHeadAttention(num_heads=4, key_dim=width // 4)(x, x)
        x = layers.LayerNormalization()(x + attended)
        hidden = layers.Dense(width * 4, activation="relu")(x)
        x = layers.LayerNormalization()(x + layers.Dense(width)(hidden))
    outputs = layers.Dense(NUM_CLASSES)(layers.GlobalAveragePooling1D()(x))
    return keras.Model(tokens, outputs, name="transformer")


MODELS = {
    "mlp": BenchModel("mlp", _mlp, (784,), default_batch=128),
    "cnn": BenchModel("cnn", _cnn, (32, 32, 3)),
    "resnet": BenchModel("resnet", _resnet, (32, 32, 3)),
    "transformer": BenchModel("transformer", _transformer, (64,), "int32", default_batch=32),
}


def get(name: str) -> BenchModel:
    """The benchmark model called `name`; the error lists the others."""
    if name not in MODELS:
        raise ValueError(f"unknown benchmark model {name!r}; choose one of {', '.join(MODELS)}")
    return MODELS[name]


def compiled(spec: BenchModel) -> keras.Model:
    """Builds and compiles `spec` for training with SGD and cross-entropy."""
    model = spec.build()
    model.compile(
        optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def synthetic_example(spec: BenchModel, seed: int = 0) -> tuple[tf.Tensor, tf.Tensor]:
    """One random (input, label) example of `spec`'s shape."""
    if spec.input_dtype == "int32":
        x = tf.random.stateless_uniform(spec.input_shape, (seed, 1), 0, 1000, dtype=tf.int32)
    else:
        x = tf.random.stateless_normal(spec.input_shape, (seed, 1))
    return x, tf.constant(seed % NUM_CLASSES, tf.int32)
