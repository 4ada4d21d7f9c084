"""Gradient compression: all-reduce gradients in float16 or bfloat16.

Horovod's ``Compression.fp16`` is the model: each float32 gradient is cast to
16 bits before the all-reduce and back after, halving the bytes every worker
sends. Keras already divides the loss by the number of replicas, so the sum
stays in float16's range; what is lost is precision (about 3 significant
digits for float16, 2 for bfloat16), so weights drift from float32 training by
a small relative amount each step.

It acts through `gradient_hooks`: the hook ``"compression"`` replaces the
all-reduce (stage ``"reduce"``), so the NaN check and the step clock still run
on each replica's float32 gradients before it, and the gradients come back as
float32 after it.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from mirrorkit.cluster import chief
from mirrorkit.training import gradient_hooks
from mirrorkit.training.gradient_hooks import innermost_optimizer

DTYPES = {"fp16": tf.float16, "bf16": tf.bfloat16}


def apply(model: keras.Model, compression: str, strategy: tf.distribute.Strategy) -> None:
    """Makes `model`'s optimizer all-reduce float32 gradients as `compression` (said once).

    Args:
        model: a compiled model.
        compression: ``"fp16"`` or ``"bf16"``.
        strategy: the model's strategy; nothing changes with one replica.

    Raises:
        ValueError: an unknown `compression`, or a model without an optimizer.
        InternalChangedError: the optimizer has no all-reduce method to replace.

    Example:
    ```python
    import keras
    import mirrorkit as mk
    from mirrorkit.training import compression, gradient_hooks

    def make_model():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        return model

    strategy = mk.strategy(cpu_replicas=2)
    model = mk.build(make_model, strategy)  # as mk.build(..., gradient_compression="bf16")
    compression.apply(model, "bf16", strategy)
    print([hook.name for hook in gradient_hooks.hooks(model.optimizer)])  # ['compression']
    ```
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
    gradient_hooks.require(optimizer, used_for="gradient_compression")
    if strategy.num_replicas_in_sync < 2:
        return
    wire = DTYPES[compression]

    def compressed_all_reduce(grads_and_vars, all_reduce):
        pairs = list(grads_and_vars)
        sent = [(_cast(g, tf.float32, wire), v) for g, v in pairs]
        received = all_reduce(sent)
        return [
            (_cast(g, wire, tf.float32), v) if original is not None else (g, v)
            for (g, v), (original, _) in zip(received, pairs, strict=True)
        ]

    gradient_hooks.register(
        optimizer,
        gradient_hooks.GradientHook("compression", compressed_all_reduce),
        used_for="gradient_compression",
    )
    chief.say_once(
        f"compression-{compression}",
        f"gradients are all-reduced in {wire.name} (gradient_compression={compression!r}): half "
        "the bytes, with less precision than float32",
    )


def _cast(gradient, source: tf.DType, target: tf.DType):
    if isinstance(gradient, tf.Tensor) and gradient.dtype == source:
        return tf.cast(gradient, target)
    return gradient
