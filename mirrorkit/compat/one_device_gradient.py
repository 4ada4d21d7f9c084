"""Repairs: the optimizer updates the weights with one device's gradient of the global batch.

Upstream: keras-team/keras#19891 (loss scaling under tf.distribute) for the
averaging; none found for clipping and sparse slices
(docs: compat/#clipping-and-sparse-gradients-across-replicas).
Keras's TensorFlow optimizer
(Keras 3.10-3.15) applies a step in each replica in this order: clipping
(``BaseOptimizer._clip_gradients``), weight decay, then
``TFOptimizer._backend_update_step``: the all-reduce (a sum), and the update
in the cross-replica context. So under N replicas:

- ``clipnorm``, ``global_clipnorm`` and ``clipvalue`` act on each replica's own
  gradient before the sum, where one device clips the gradient of the
  global batch (tf.keras 2 clipped after its all-reduce, as PyTorch DDP users do);
- an ``IndexedSlices`` gradient is all-reduced by concatenating the
  replicas' slices. Keras's sparse matmul (a ``Dense`` layer on a sparse
  input, through ``tf.nn.embedding_lookup_sparse``) gives one slice per id
  of the batch, so one device has one slice per id of the global batch while
  the concatenation has one per id and replica; optimizers that square
  their gradient slice by slice (Keras's Adam, AdamW, RMSprop, Adagrad) then
  add ``g1**2 + g2**2`` where one device adds ``(g1 + g2)**2``. An
  ``Embedding`` lookup gives one slice per occurrence, on one device too,
  so its concatenation is one device's already.

The repairs, in a replica context of a strategy that spans replicas:

- ``clip_after_all_reduce`` (``_clip_gradients``): clipping waits for the
  all-reduce; ``averaged_gradients`` (or the accumulation repair) clips
  the summed gradient, with Keras's own clipping.
- ``averaged_gradients`` (``_backend_update_step``): inside ``fit``'s step,
  where every loss is one device's (`mirrorkit.compat.one_device_loss`),
  divides each replica's gradients by N; all-reduces them through the
  optimizer's ``_all_reduce_sum_gradients`` (the gradient hook chain:
  compression, `NaNGuard`, the step clock); merges the slices of a
  gradient whose ids were made unique in the replica (its indices come from
  a ``Unique`` op in the traced step) into one slice per id; clips; then
  applies the update as Keras does. Outside ``fit`` (a custom loop calling
  ``strategy.run``) the gradients are summed as TensorFlow's contract says,
  and clipped and merged after the sum too.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from mirrorkit import internals
from mirrorkit.cluster.workers import spans_replicas
from mirrorkit.compat import one_device_loss
from mirrorkit.patching import fit_step
from mirrorkit.patching.repair import Repair

_OPTIMIZER = "keras.src.backend.tensorflow.optimizer"
_UPSTREAM = "keras-team/keras#19891 (loss scaling under tf.distribute)"
_USED_FOR = "the averaged_gradients repair (one device's gradient on several replicas)"

#: The optimizer's private names the update step calls (Keras 3.10-3.15).
_INTERNALS = ("_all_reduce_sum_gradients", "_distributed_tf_update_step", "_distribution_strategy")

#: Ops a gradient's indices pass through between ``tf.unique`` and the gradient.
_PASS_THROUGH = frozenset({"Identity", "Reshape", "Cast"})
_UNIQUE = frozenset({"Unique", "UniqueV2", "UniqueWithCounts", "UniqueWithCountsV2"})


def divided(gradient, replicas: int):
    """`gradient` (a tensor, `tf.IndexedSlices` or None) divided by `replicas`."""
    if gradient is None:
        return None
    if isinstance(gradient, tf.IndexedSlices):
        values = gradient.values / tf.cast(replicas, gradient.values.dtype)
        return tf.IndexedSlices(values, gradient.indices, gradient.dense_shape)
    return gradient / tf.cast(replicas, gradient.dtype)


def clipping_waits() -> bool:
    """Whether clipping waits for the all-reduce: a replica context spanning replicas."""
    if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
        return False
    return spans_replicas(tf.distribute.get_strategy())


def clips(optimizer) -> bool:
    """Whether `optimizer` clips (``clipnorm``, ``global_clipnorm`` or ``clipvalue``)."""
    return bool(optimizer.clipnorm or optimizer.global_clipnorm or optimizer.clipvalue)


def clip_summed(optimizer, grads: list) -> list:
    """`grads`, the all-reduced gradients, clipped by Keras's own ``_clip_gradients``.

    Args:
        optimizer: the Keras optimizer whose ``clipnorm``, ``global_clipnorm``
            or ``clipvalue`` apply.
        grads: the summed gradients (plain tensors or `tf.IndexedSlices`).

    Returns:
        The clipped gradients (`grads` itself when the optimizer does not clip).
    """
    if not clips(optimizer):
        return grads
    if CLIP.active:
        return list(CLIP.original(optimizer, grads))
    name = "keras optimizer._clip_gradients"
    keras_clip = internals.require(optimizer, "_clip_gradients", name=name, used_for=_USED_FOR)
    return list(keras_clip(grads))


def summed_per_id(gradient) -> bool:
    """Whether `gradient` holds one slice per id of this replica's batch (from ``tf.unique``).

    Read from the traced step: the indices of Keras's sparse matmul gradient
    come from a ``Unique`` op; an ``Embedding`` lookup's come from the ids
    themselves. Eagerly (``run_eagerly=True``) there is no graph to read:
    False, and the slices stay one per replica, as TensorFlow concatenates them.
    """
    if not isinstance(gradient, tf.IndexedSlices):
        return False
    tensor = gradient.indices
    for _ in range(8):
        try:
            op = tensor.op
        except AttributeError:  # an eager tensor
            return False
        if op.type in _UNIQUE:
            return True
        if op.type not in _PASS_THROUGH or not op.inputs:
            return False
        tensor = op.inputs[0]
    return False


def one_slice_per_id(gradient: tf.IndexedSlices) -> tf.IndexedSlices:
    """The all-reduced `gradient` with the replicas' slices of each id summed into one."""
    ids, position = tf.unique(gradient.indices)
    values = tf.math.unsorted_segment_sum(gradient.values, position, tf.shape(ids)[0])
    return tf.IndexedSlices(values, ids, gradient.dense_shape)


def _averaged_gradients(original):
    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        if not clipping_waits():
            return original(self, grads, trainable_variables, learning_rate)
        for attr in _INTERNALS:
            internals.require(self, attr, name=f"keras TFOptimizer.{attr}", used_for=_USED_FOR)
        replicas = fit_step.averaging_replicas()
        if replicas > 1:
            grads = [divided(g, replicas) for g in grads]
        per_id = [summed_per_id(g) for g in grads]
        variables = [v.value if isinstance(v, keras.Variable) else v for v in trainable_variables]
        summed = self._all_reduce_sum_gradients(list(zip(grads, variables, strict=True)))
        grads = [
            one_slice_per_id(g) if merge and g is not None else g
            for (g, _), merge in zip(summed, per_id, strict=True)
        ]
        grads = clip_summed(self, grads)
        tf.__internal__.distribute.interim.maybe_merge_call(
            self._distributed_tf_update_step,
            self._distribution_strategy,
            list(zip(grads, variables, strict=True)),
            learning_rate,
        )

    _backend_update_step.__wrapped__ = original
    return _backend_update_step


def _clip_after_all_reduce(original):
    def _clip_gradients(self, grads):
        return grads if clipping_waits() else original(self, grads)

    _clip_gradients.__wrapped__ = original
    return _clip_gradients


CLIP = Repair(
    name="clip_after_all_reduce",
    upstream="clipping acts on each replica's gradient before the all-reduce "
    "(docs: compat/#clipping-and-sparse-gradients-across-replicas)",
    module=_OPTIMIZER,
    target="TFOptimizer._clip_gradients",
    replacement=_clip_after_all_reduce,
    applies_to=spans_replicas,
    account="clipping-and-sparse-gradients-across-replicas",
    tests=(
        "tests/test_clipping.py::test_keras_alone_clips_each_replicas_gradient",
        "tests/test_clipping.py::test_fit_clips_the_averaged_gradient_as_one_device",
        "tests/test_clipping.py::test_four_replicas_clip_as_one_device_too",
        "tests/test_clipping.py::test_train_on_batch_clips_as_one_device",
        "tests/test_clipping.py::test_accumulated_gradients_are_clipped_after_the_all_reduce",
        "tests/test_clipping.py::test_a_custom_loop_clips_the_summed_gradient_as_one_device",
    ),
)

REPAIRS = (
    Repair(
        name="averaged_gradients",
        upstream=_UPSTREAM,
        module=_OPTIMIZER,
        target="TFOptimizer._backend_update_step",
        replacement=_averaged_gradients,
        applies_to=spans_replicas,
        account="losses-in-your-own-train_step",
        tests=(
            *one_device_loss.TESTS,  # the same failure: a loss reduced by hand
            "tests/test_clipping.py::test_fit_clips_the_averaged_gradient_as_one_device",
            "tests/test_sparse_gradients.py::test_keras_alone_squares_each_replicas_slice",
            "tests/test_sparse_gradients.py::test_a_dense_layer_on_sparse_inputs_trains_as_one_device",
            "tests/test_sparse_gradients.py::test_embedding_ids_repeated_within_and_across_replicas_train_as_one_device",
        ),
    ),
    CLIP,
)
