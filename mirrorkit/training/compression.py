"""Gradient compression: all-reduce gradients in float16 or bfloat16.

Horovod's ``Compression.fp16`` is the model: each float32 gradient is cast to
16 bits before the all-reduce and back after, halving the bytes every worker
sends. Keras already divides the loss by the number of replicas, so the sum
stays in float16's range; what is lost is precision (about 3 significant
digits for float16, 2 for bfloat16), so weights drift from float32 training by
a small relative amount each step.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from mirrorkit import internals
from mirrorkit.cluster import chief

DTYPES = {"fp16": tf.float16, "bf16": tf.bfloat16}


def innermost_optimizer(model: keras.Model) -> Any:
    """The optimizer that all-reduces gradients (inside a LossScaleOptimizer, if any)."""
    optimizer = getattr(model, "optimizer", None)
    while optimizer is not None and hasattr(optimizer, "inner_optimizer"):
        optimizer = optimizer.inner_optimizer
    return optimizer


def apply(model: keras.Model, compression: str, strategy: tf.distribute.Strategy) -> None:
    """Makes `model`'s optimizer all-reduce float32 gradients as `compression` (said once).

    Args:
        model: a compiled model.
        compression: ``"fp16"`` or ``"bf16"``.
        strategy: the model's strategy; nothing changes with one replica.

    Raises:
        ValueError: an unknown `compression`, or a model without an optimizer.
    """
    if compression not in DTYPES:
        raise ValueError(
            f"gradient_compression must be None, 'fp16' or 'bf16'; got {compression!r}"
        )
    optimizer = innermost_optimizer(model)
    if optimizer is None:
        raise ValueError(
            "gradient_compression needs a compiled model with a Keras optimizer; compile the "
            "model inside the function given to mk.build"
        )
    all_reduce = internals.require(
        optimizer,
        "_all_reduce_sum_gradients",
        name="keras optimizer._all_reduce_sum_gradients",
        used_for="gradient_compression",
    )
    if strategy.num_replicas_in_sync < 2:
        return
    wire = DTYPES[compression]

    def compressed_all_reduce(grads_and_vars):
        pairs = list(grads_and_vars)
        sent = [(_cast(g, tf.float32, wire), v) for g, v in pairs]
        received = all_reduce(sent)
        return [
            (_cast(g, wire, tf.float32), v) if original is not None else (g, v)
            for (g, v), (original, _) in zip(received, pairs, strict=True)
        ]

    optimizer._all_reduce_sum_gradients = compressed_all_reduce
    chief.say_once(
        f"compression-{compression}",
        f"gradients are all-reduced in {wire.name} (gradient_compression={compression!r}): half "
        "the bytes, with less precision than float32",
    )


def _cast(gradient, source: tf.DType, target: tf.DType):
    if isinstance(gradient, tf.Tensor) and gradient.dtype == source:
        return tf.cast(gradient, target)
    return gradient
