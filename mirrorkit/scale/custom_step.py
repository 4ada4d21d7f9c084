"""Custom ``train_step`` under N replicas: the loss Keras hands it is scaled by 1/N.

Under a strategy with N replicas, every Keras loss (``self.compute_loss``,
``keras.losses.*`` objects) returns each replica's mean loss divided by N, so
that the all-reduce, which sums the replicas' gradients, gives one device's
gradient of the global batch. Keras's own ``train_step`` multiplies the value
back before logging it; a custom ``train_step`` written as in the keras.io
guide ("Customizing what happens in fit()") logs it as it is, so its logged
loss reads 1/N of one device's while its weights agree. `unscale_loss` is
the one-line fix::

    self.loss_tracker.update_state(mk.unscale_loss(loss))
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf


def unscale_loss(loss: Any) -> Any:
    """The loss a Keras loss returned inside a replica, as one device would log it.

    Multiplies by the replicas in sync (nothing under one replica), undoing the
    1/N that Keras's losses apply under a strategy so that summed gradients
    equal one device's. Use it for what you log, never for the gradient.

    Args:
        loss: a loss tensor from ``self.compute_loss(...)`` or a Keras loss
            object, inside ``train_step``/``test_step``.

    Returns:
        ``loss`` times ``num_replicas_in_sync`` of the current strategy.

    Example:
    ```python
    import keras
    import numpy as np
    import tensorflow as tf
    import mirrorkit as mk

    class Model(keras.Model):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.dense = keras.layers.Dense(1)
            self.loss_tracker = keras.metrics.Mean(name="loss")

        def call(self, x):
            return self.dense(x)

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = self.compute_loss(y=y, y_pred=self(x, training=True))
            grads = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply(grads, self.trainable_variables)
            self.loss_tracker.update_state(mk.unscale_loss(loss))  # as on one device
            return {"loss": self.loss_tracker.result()}

        @property
        def metrics(self):
            return [self.loss_tracker]

    strategy = mk.strategy(cpu_replicas=2)
    with strategy.scope():
        model = Model()
        model.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((64, 3), "float32"), np.zeros((64, 1), "float32")
    model.fit(mk.distribute((x, y), strategy, global_batch_size=32), epochs=1)
    ```
    """
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    if replicas == 1:
        return loss
    loss = tf.convert_to_tensor(loss)
    return loss * tf.cast(replicas, loss.dtype)


def custom_train_step(model: keras.Model) -> str | None:
    """The name of the user class that overrides ``train_step``, or None for Keras's own."""
    for cls in type(model).__mro__:
        if "train_step" in vars(cls):
            return None if cls.__module__.startswith("keras.") else cls.__name__
    return None
