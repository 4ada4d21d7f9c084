"""Batch normalisation whose statistics are per replica: found by `mk.build` and ``fit``, said once.

A trainable Keras ``BatchNormalization`` layer normalises with the mean and
variance of the batch it sees. Under a strategy of N replicas each replica
sees 1/N of the global batch, so the statistics, the gradients and the
moving averages differ from one device on the global batch, unless the layer
is built with ``BatchNormalization(synchronized=True)``, which all-reduces
them. This is no error (per-replica statistics are a valid choice, and
cheaper), so `mk.build`, and ``fit`` whatever built the model
(`mirrorkit.scale.fit_notices`), say it once on the chief rather than
changing the model. A frozen layer (``trainable = False``, e.g. inside a base
model frozen for transfer learning) normalises with its moving statistics,
the same on every replica, and is not counted; once the base is unfrozen
(``base_model.trainable = True``; Keras 3 then trains its statistics even
under ``base_model(x, training=False)``, keras-team/keras#20285) it is.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from mirrorkit import internals
from mirrorkit.cluster import chief
from mirrorkit.cluster.workers import spans_replicas


def unsynchronized_batch_norm(model: keras.Model) -> list[str]:
    """Names of the trainable, unsynchronised ``BatchNormalization`` layers in `model`, nested too.

    Args:
        model: a Keras model, built or not.

    Returns:
        The layers' names, in the model's order; empty when there are none
        (frozen layers, ``trainable = False``, use their moving statistics and
        are left out).

    Example:
    ```python
    import keras
    from mirrorkit.scale.batchnorm import unsynchronized_batch_norm

    model = keras.Sequential([keras.Input((4,)), keras.layers.BatchNormalization()])
    unsynchronized_batch_norm(model)  # ["batch_normalization"]
    ```
    """
    return [
        layer.name
        for layer in all_layers(model)
        if isinstance(layer, keras.layers.BatchNormalization)
        and layer.trainable
        and not layer.synchronized
    ]


def synchronize_batch_norm(model: keras.Model) -> list[str]:
    """Makes every ``BatchNormalization`` layer in `model`, nested too, all-reduce its statistics.

    The same as building each with ``BatchNormalization(synchronized=True)``,
    for a model that is already built, a pretrained base model included:
    Keras reads the layer's ``synchronized`` attribute each time it traces the
    step, so call this before ``fit`` (or set ``model.train_function = None``
    after a ``fit``). Under N replicas each layer then normalises with the
    global batch's statistics, as one device does, at the cost of one small
    all-reduce per layer and step; under one replica nothing changes.

    Args:
        model: a Keras model (or layer) holding the batch-normalisation layers.

    Returns:
        The names of the layers it changed, in the model's order.

    Example:
    ```python
    import keras
    import mirrorkit as mk

    base_model = keras.Sequential(
        [keras.Input((8, 8, 3)), keras.layers.Conv2D(4, 3), keras.layers.BatchNormalization()]
    )
    base_model.trainable = True  # fine-tuning: its statistics train again
    print(mk.synchronize_batch_norm(base_model))  # ['batch_normalization']
    ```
    """
    changed = []
    for layer in all_layers(model):
        if isinstance(layer, keras.layers.BatchNormalization) and not layer.synchronized:
            layer.synchronized = True
            changed.append(layer.name)
    return changed


def all_layers(model: keras.Model) -> list[keras.layers.Layer]:
    """Every layer inside `model`, nested models' layers included, in order."""
    flatten = internals.require(
        model,
        "_flatten_layers",
        name="keras Layer._flatten_layers",
        used_for="finding layers inside nested models",
    )
    return list(flatten(include_self=False, recursive=True))


def check(model: keras.Model, strategy: tf.distribute.Strategy) -> list[str]:
    """Says once, on the chief, when `model` normalises batches per replica under `strategy`.

    Called by `mk.build` and when ``fit`` makes its train function. Nothing
    is said for one replica, or when every trainable ``BatchNormalization``
    layer is synchronised.

    Args:
        model: the model `mk.build` just built.
        strategy: the strategy it was built under.

    Returns:
        The names of the unsynchronised layers under a multi-replica
        strategy; empty otherwise.
    """
    if not spans_replicas(strategy):
        return []
    names = unsynchronized_batch_norm(model)
    if names:
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        replicas = strategy.num_replicas_in_sync
        chief.say_once(
            "batchnorm-per-replica",
            f"{len(names)} BatchNormalization layer(s) ({shown}) compute batch statistics on "
            f"each replica's 1/{replicas} of the global batch, so training differs from one "
            "device on the global batch; build them with BatchNormalization(synchronized=True), "
            "or call mk.synchronize_batch_norm(model) before fit, to all-reduce the statistics "
            "(one small all-reduce per layer and step)",
        )
    return names
