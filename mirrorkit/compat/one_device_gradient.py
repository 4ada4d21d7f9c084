"""Repair: the optimizer averages the replicas' gradients inside ``fit``'s step.

Upstream: keras-team/keras#19891 (loss scaling under tf.distribute);
``docs/compat.md``, "Losses in your own train_step". Inside ``fit``'s step
every loss is one device's (`mirrorkit.compat.one_device_loss`), so the
optimizer divides each replica's gradients by N before its summing
all-reduce: the sum is then one device's gradient.
"""

from __future__ import annotations

import tensorflow as tf

from mirrorkit.compat._repair import Repair, spans_replicas
from mirrorkit.training import fit_step

_OPTIMIZER = "keras.src.backend.tensorflow.optimizer"
_UPSTREAM = "keras-team/keras#19891 (loss scaling under tf.distribute)"


def divided(gradient, replicas: int):
    """`gradient` (a tensor, `tf.IndexedSlices` or None) divided by `replicas`."""
    if gradient is None:
        return None
    if isinstance(gradient, tf.IndexedSlices):
        values = gradient.values / tf.cast(replicas, gradient.values.dtype)
        return tf.IndexedSlices(values, gradient.indices, gradient.dense_shape)
    return gradient / tf.cast(replicas, gradient.dtype)


def _averaged_gradients(original):
    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        replicas = fit_step.averaging_replicas()
        if replicas > 1:
            grads = [divided(g, replicas) for g in grads]
        return original(self, grads, trainable_variables, learning_rate)

    _backend_update_step.__wrapped__ = original
    return _backend_update_step


REPAIRS = (
    Repair(
        name="averaged_gradients",
        upstream=_UPSTREAM,
        module=_OPTIMIZER,
        target="TFOptimizer._backend_update_step",
        replacement=_averaged_gradients,
        applies_to=spans_replicas,
    ),
)
