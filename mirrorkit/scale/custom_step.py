"""Custom ``train_step`` under N replicas: which class overrides it, and `unscale_loss`.

Under a strategy with N replicas, plain Keras divides every Keras loss
(``self.compute_loss``, ``keras.losses.*`` objects) by N, so that the
all-reduce, which sums the replicas' gradients, gives one device's gradient
of the global batch; a custom ``train_step`` that logs such a loss logs 1/N
of one device's. Inside ``fit`` mirrorkit removes that difference
(`mirrorkit.compat.one_device_loss`): every loss there is one device's and
the gradients are averaged, so a custom ``train_step`` needs no change.
`unscale_loss` is for the other places a Keras loss is computed under a
strategy: a custom ``tf.function`` loop that calls ``strategy.run`` itself.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from mirrorkit.patching import fit_step


def unscale_loss(loss: Any) -> Any:
    """The loss a Keras loss returned inside a replica, as one device would log it.

    In a custom loop (``strategy.run`` in your own ``tf.function``) Keras's
    losses return each replica's loss divided by the replicas in sync, so that
    summed gradients equal one device's; this multiplies it back. Inside
    ``fit``'s ``train_step``/``test_step`` mirrorkit already makes every loss
    one device's, so there it returns `loss` unchanged (code written for
    earlier mirrorkit releases keeps working). Use it for what you log, never
    for the gradient.

    Args:
        loss: a loss tensor from ``self.compute_loss(...)`` or a Keras loss
            object, computed inside a replica.

    Returns:
        ``loss`` times ``num_replicas_in_sync`` of the current strategy, or
        ``loss`` itself inside ``fit``'s step and under one replica.

    Example:
    ```python
    import keras
    import numpy as np
    import tensorflow as tf
    import mirrorkit as mk

    strategy = mk.strategy(cpu_replicas=2)
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        loss_fn = keras.losses.MeanSquaredError()

    @tf.function
    def train_step(x, y):
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))  # divided by 2 replicas
            grads = tape.gradient(loss, model.trainable_variables)
            model.optimizer.apply(grads, model.trainable_variables)
            return mk.unscale_loss(loss)  # this replica's loss, as one device logs it

        losses = strategy.run(replica_step, args=(x, y))
        return strategy.reduce("MEAN", losses, axis=None)

    x, y = np.ones((64, 3), "float32"), np.zeros((64, 1), "float32")
    for x_batch, y_batch in mk.distribute((x, y), strategy, global_batch_size=32):
        print(float(train_step(x_batch, y_batch)))
    ```
    """
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    if replicas == 1 or fit_step.active():
        return loss
    loss = tf.convert_to_tensor(loss)
    return loss * tf.cast(replicas, loss.dtype)


def custom_train_step(model: keras.Model) -> str | None:
    """The name of the user class that overrides ``train_step``, or None for Keras's own."""
    return overrides(model, "train_step")


def overrides(model: keras.Model, method: str) -> str | None:
    """The name of the user class that overrides `method` of Keras's model, or None."""
    for cls in type(model).__mro__:
        if method in vars(cls):
            return None if cls.__module__.startswith("keras.") else cls.__name__
    return None
