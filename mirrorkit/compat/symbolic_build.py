"""Repair: build the model from one local replica's batch, not a cross-replica mean.

Upstream: UPSTREAM.md items 1 and 10; keras-team/keras#20585 (multi-worker),
keras-team/keras#19246 and tensorflow/tensorflow#80951 (single host).
``TensorFlowTrainer._maybe_symbolic_build`` eagerly calls
``strategy.reduce("MEAN", first_batch, axis=None)`` on the whole ``(x, y)``
structure before ``fit``, ``evaluate``, ``train_on_batch`` and
``test_on_batch``. Under MultiWorkerMirroredStrategy that raises ``ValueError:
Attempt to convert a value (PerReplica...)``; under MirroredStrategy it needs
equal per-replica shapes and numeric dtypes, so a first batch smaller than the
replica count, or string inputs, fail. The build needs only shapes and dtypes,
which the first local replica's batch has; the replacement uses it, with no
collective. Verified on Keras 3.10-3.15.1.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from mirrorkit.compat._repair import Repair, spans_replicas


def _first_local(value):
    if isinstance(value, tf.distribute.DistributedValues):
        return value.values[0]
    return value


def _replacement(original):
    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        if self._distribute_strategy is None:
            return original(self, iterator=iterator, data_batch=data_batch)
        if iterator is not None:
            for _, _, it in iterator:
                data_batch = keras.tree.map_structure(_first_local, next(it))
                break
        with self.distribute_strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    _maybe_symbolic_build.__wrapped__ = original
    return _maybe_symbolic_build


REPAIR = Repair(
    name="symbolic_build",
    upstream="keras-team/keras#20585, #19246; UPSTREAM.md items 1 and 10",
    module="keras.src.backend.tensorflow.trainer",
    target="TensorFlowTrainer._maybe_symbolic_build",
    replacement=_replacement,
    applies_to=spans_replicas,
)
