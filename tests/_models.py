"""The tiny Keras model the tests share: one Dense layer, compiled with mean squared error.

It was defined in 7 test files, each a little differently; a test that needs a
model of its own (several layers, fixed weights, batch norm) still defines it.
"""

from __future__ import annotations

from typing import Any


def tiny_model(inputs: int = 3, units: int = 1, optimizer: Any = "sgd", **compile_kwargs: Any):
    """A compiled ``Sequential([Input((inputs,)), Dense(units)])``; a model function for mk.build.

    Args:
        inputs: the number of input features.
        units: the number of outputs.
        optimizer: what ``compile`` takes: a name or an optimizer object.
        **compile_kwargs: more ``compile`` arguments (``steps_per_execution=2``, ...).

    Returns:
        The compiled model, built under the strategy scope it is called in.

    Example:
        ```python
        import functools

        import mirrorkit as mk
        from _models import tiny_model

        model = mk.build(functools.partial(tiny_model, 4, 2, "adam"), mk.strategy("one_device"))
        ```
    """
    import keras

    model = keras.Sequential([keras.Input((inputs,)), keras.layers.Dense(units)])
    model.compile(optimizer=optimizer, loss="mse", **compile_kwargs)
    return model


def own_update_model(inputs: int = 3):
    """A model whose ``train_step`` updates its weights itself (``assign_sub``), never through
    its optimizer: a step that never reaches the optimizer's gradient all-reduce."""
    import keras
    import tensorflow as tf

    class OwnUpdate(keras.Model):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = keras.ops.mean(keras.ops.square(self(x, training=True) - y))
            grads = tape.gradient(loss, self.trainable_variables)
            for variable, grad in zip(self.trainable_variables, grads, strict=True):
                variable.assign_sub(0.01 * grad)
            return {"loss": loss}

    x = keras.Input((inputs,))
    model = OwnUpdate(x, keras.layers.Dense(1)(x))
    model.compile(optimizer="sgd")
    return model
