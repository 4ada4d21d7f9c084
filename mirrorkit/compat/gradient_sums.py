"""What the optimizer step across replicas does to gradients: averaged, summed, merged, clipped.

The parts of `mirrorkit.compat.optimizer_step`'s pipeline that act on the
gradients themselves:

- `divided`: each replica's gradient divided by N inside ``fit``'s step, where
  every loss is one device's (`mirrorkit.compat.one_device_loss`);
- `all_reduce`: the one all-reduce of a step, through the optimizer's
  ``_all_reduce_sum_gradients`` (the gradient hook chain of
  `mirrorkit.training.gradient_hooks` where hooks are registered: compression,
  `NaNGuard`, the step clock), with any *riders* (small tensors that other
  checks sum across replicas) in the same collective;
- `summed_per_id` / `one_slice_per_id`: an ``IndexedSlices`` gradient is
  all-reduced by concatenating the replicas' slices. Keras's sparse matmul (a
  ``Dense`` layer on a sparse input, through ``tf.nn.embedding_lookup_sparse``)
  gives one slice per id of the batch, so one device has one slice per id of
  the global batch while the concatenation has one per id and replica;
  optimizers that square their gradient slice by slice (Adam, AdamW, RMSprop,
  Adagrad) then add ``g1**2 + g2**2`` where one device adds ``(g1 + g2)**2``.
  A slice whose indices come from ``tf.unique`` in the traced step is merged
  into one slice per id after the all-reduce. An ``Embedding`` lookup gives
  one slice per occurrence, on one device too, and is left as it is;
- `clip_reduced`: Keras's own ``_clip_gradients`` on the all-reduced gradient,
  as one device clips the gradient of the global batch (Keras clips each
  replica's own gradient before its all-reduce; tf.keras 2 and PyTorch DDP
  users clip after it).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from mirrorkit import internals

#: The optimizer's private method that sums the replicas' gradients (Keras 3.10-3.16).
ALL_REDUCE = "_all_reduce_sum_gradients"
#: Ops a gradient's indices pass through between ``tf.unique`` and the gradient.
_PASS_THROUGH = frozenset({"Identity", "Reshape", "Cast"})
_UNIQUE = frozenset({"Unique", "UniqueV2", "UniqueWithCounts", "UniqueWithCountsV2"})


def divided(gradient: Any, divisor: Any) -> Any:
    """`gradient` (a tensor, `tf.IndexedSlices` or None) divided by `divisor` (N, a loss scale)."""
    if gradient is None or (isinstance(divisor, int) and divisor == 1):
        return gradient
    if isinstance(gradient, tf.IndexedSlices):
        values = gradient.values / tf.cast(divisor, gradient.values.dtype)
        return tf.IndexedSlices(values, gradient.indices, gradient.dense_shape)
    return gradient / tf.cast(divisor, gradient.dtype)


def multiplied(gradient: Any, factor: Any) -> Any:
    """`gradient` (a tensor, `tf.IndexedSlices` or None) times `factor`."""
    if gradient is None:
        return None
    if isinstance(gradient, tf.IndexedSlices):
        values = gradient.values * tf.cast(factor, gradient.values.dtype)
        return tf.IndexedSlices(values, gradient.indices, gradient.dense_shape)
    return gradient * tf.cast(factor, gradient.dtype)


def all_reduce(
    optimizer: Any, grads: list, variables: list, riders: dict[str, tf.Tensor], *, used_for: str
) -> tuple[list, dict[str, tf.Tensor]]:
    """Every replica's `grads` and `riders` summed in one all-reduce (replica context).

    Args:
        optimizer: the Keras optimizer whose ``_all_reduce_sum_gradients`` (or hook chain)
            sums them.
        grads: this replica's gradients, one per variable (None where there is none).
        variables: the variables, as TensorFlow variables.
        riders: name -> a float32 vector of this replica's, summed in the same collective.
        used_for: what needs the all-reduce, for the error if Keras lost it.

    Returns:
        The summed gradients (None kept) and the summed riders, the same on every replica.
    """
    reduce = internals.require(
        optimizer, ALL_REDUCE, name=f"keras optimizer.{ALL_REDUCE}", used_for=used_for
    )
    names = list(riders)
    pairs = list(zip(grads, variables, strict=True))
    summed = list(reduce(pairs + [(riders[name], None) for name in names]))
    reduced = [g for g, _ in summed[: len(pairs)]]
    return reduced, {name: g for name, (g, _) in zip(names, summed[len(pairs) :], strict=True)}


def summed_per_id(gradient: Any) -> bool:
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


def clips(optimizer: Any) -> bool:
    """Whether `optimizer` clips (``clipnorm``, ``global_clipnorm`` or ``clipvalue``)."""
    return bool(optimizer.clipnorm or optimizer.global_clipnorm or optimizer.clipvalue)


def clip_reduced(optimizer: Any, grads: list, *, used_for: str) -> list:
    """`grads`, all-reduced, clipped by Keras's own ``_clip_gradients`` (unchanged if none).

    Args:
        optimizer: the Keras optimizer whose ``clipnorm``, ``global_clipnorm`` or
            ``clipvalue`` apply.
        grads: the summed gradients (plain tensors or `tf.IndexedSlices`).
        used_for: what clips, for the error if Keras lost its clipping method.

    Returns:
        The clipped gradients (`grads` itself when the optimizer does not clip).
    """
    if not clips(optimizer):
        return grads
    keras_clip = internals.require(
        optimizer, "_clip_gradients", name="keras optimizer._clip_gradients", used_for=used_for
    )
    return list(keras_clip(grads))
