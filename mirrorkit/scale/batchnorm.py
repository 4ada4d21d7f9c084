"""Batch normalisation whose statistics are per replica: found by `mk.build`, said once.

A Keras ``BatchNormalization`` layer normalises with the mean and variance of
the batch it sees. Under a strategy of N replicas each replica sees 1/N of
the global batch, so the statistics, the gradients and the moving averages
differ from one device on the global batch, unless the layer is built with
``BatchNormalization(synchronized=True)``, which all-reduces them. This is
no error (per-replica statistics are a valid choice, and cheaper), so
`mk.build` says it once on the chief rather than changing the model.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from mirrorkit import internals
from mirrorkit.cluster import chief
from mirrorkit.compat._repair import spans_replicas


def unsynchronized_batch_norm(model: keras.Model) -> list[str]:
    """Names of the ``BatchNormalization`` layers in `model`, nested too, that are unsynchronised.

    Args:
        model: a Keras model, built or not.

    Returns:
        The layers' names, in the model's order; empty when there are none.

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
        if isinstance(layer, keras.layers.BatchNormalization) and not layer.synchronized
    ]


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

    Called by `mk.build`. Nothing is said for one replica, or when every
    ``BatchNormalization`` layer is synchronised.

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
            "device on the global batch; build them with BatchNormalization(synchronized=True) "
            "to all-reduce the statistics (one small all-reduce per layer and step)",
        )
    return names
