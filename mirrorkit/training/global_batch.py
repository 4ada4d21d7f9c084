"""Losses over the whole global batch: every replica's examples, gathered inside the step.

A loss that compares the examples of a batch with each other (in-batch
negatives in a retrieval model, a contrastive loss such as CLIP's or
SimCLR's, any in-batch softmax) sees on each replica only that replica's
part of the batch: N replicas then train as one device on N losses of
smaller batches, not on the global batch's. `all_gather` hands every
replica every replica's examples, in the global batch's order, with the
gradient flowing back to each replica's own; `all_gather_offset` says where
this replica's examples sit among them (the positives' column in an
in-batch softmax).

With mirrorkit's ``fit`` every loss a replica computes is one device's
loss on its part of the batch and the optimizer averages the replicas'
gradients (`mirrorkit.compat.one_device_loss`): a loss averaged over the
replica's own queries against the gathered candidates then trains exactly
as one device does on the global batch. TensorFlow's gather
(``ReplicaContext.all_gather``) sums the replicas' gradients for the
gathered values before each takes its own slice, so the gradient is right
for the sum of the replicas' losses, inside ``fit`` and in custom loops.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from mirrorkit.compat import loss_forms


def _replica_context(what: str) -> tf.distribute.ReplicaContext | None:
    """The replica context to gather in; None where there is one replica (nothing to gather).

    Raises:
        RuntimeError: called in a cross-replica context (outside the step).
    """
    if tf.distribute.in_cross_replica_context():
        strategy = tf.distribute.get_strategy()
        raise RuntimeError(
            f"mk.{what} was called outside the training step, in the cross-replica context of "
            f"{type(strategy).__name__} ({strategy.num_replicas_in_sync} replicas). Call it "
            "where each replica computes its loss: in compute_loss, train_step, a layer's call, "
            "or the function given to strategy.run."
        )
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return None
    return context


def all_gather(value: Any, axis: int = 0) -> Any:
    """Every replica's `value`, concatenated along `axis` in the global batch's order.

    Call it where each replica computes its loss (``compute_loss``, a
    ``train_step``, a layer's ``call``): on N replicas and workers it returns
    the N replicas' values one after another, replica 0's first, which is the
    order of the global batch `mk.distribute` split; gradients flow back to
    each replica's own part. With one replica, or outside any strategy, it
    returns `value` unchanged, so the same code runs on one device.

    Args:
        value: a tensor, or a nested structure of tensors, of this replica's
            examples (their count may differ between replicas, e.g. a last
            partial batch in evaluation).
        axis: the batch axis.

    Returns:
        The gathered tensors, in `value`'s structure.

    Raises:
        RuntimeError: called outside the step (in the cross-replica context).

    Example:
    ```python
    import keras
    import numpy as np
    import mirrorkit as mk

    class InBatchSoftmax(keras.Model):
        # Two towers scored against every candidate of the global batch.
        def __init__(self):
            super().__init__()
            self.query = keras.layers.Dense(4)
            self.candidate = keras.layers.Dense(4)
            self.loss_fn = keras.losses.CategoricalCrossentropy(from_logits=True)

        def build(self, input_shape):
            self.query.build(input_shape["query"])
            self.candidate.build(input_shape["candidate"])

        def call(self, inputs):
            return self.query(inputs["query"])

        def compute_loss(self, x, y, y_pred, sample_weight=None, training=True):
            candidates = mk.all_gather(self.candidate(x["candidate"]))  # every replica's
            # each query's positive: its own candidate, at this replica's offset among them
            positives = mk.all_gather_offset(y_pred) + keras.ops.arange(keras.ops.shape(y_pred)[0])
            labels = keras.ops.one_hot(positives, keras.ops.shape(candidates)[0])
            scores = keras.ops.matmul(y_pred, keras.ops.transpose(candidates))
            return self.loss_fn(labels, scores, sample_weight)

    strategy = mk.strategy(cpu_replicas=2)
    with strategy.scope():
        model = InBatchSoftmax()
        model.compile(optimizer="adam")
    rng = np.random.default_rng(0)
    x = {"query": rng.normal(size=(64, 3)), "candidate": rng.normal(size=(64, 5))}
    model.fit(mk.distribute(x, strategy, global_batch_size=16), epochs=1, verbose=0)
    ```
    """
    context = _replica_context("all_gather")
    if context is None:
        return value
    gathered = loss_forms.Form("gathered", axis)  # how a loss computed on it is weighted
    return tf.nest.map_structure(
        lambda part: loss_forms.mark(context.all_gather(part, axis=axis), gathered), value
    )


def all_gather_offset(value: Any, axis: int = 0) -> tf.Tensor:
    """Where this replica's `value` starts in `all_gather(value, axis)`: an int32 scalar.

    The sum of the sizes (along `axis`) of the replicas before this one:
    ``replica_id * local batch`` when the replicas' parts are equal, and right
    when they are not. With one replica it is 0. An in-batch loss's positives
    (the diagonal of one device's ``ops.eye(n, n)``) are then
    ``offset + ops.arange(n_local)`` among the gathered candidates: pass them to
    ``ops.one_hot``, or as the labels of a sparse loss. (Keras 3.15's
    ``ops.eye(n, m, k=offset)`` on TensorFlow has the wrong shape where
    ``offset > m - n``: 4 replicas of 4 give ``eye(4, 16, k=8)`` 8 rows.)

    Args:
        value: a tensor of this replica's examples (the first, for a structure).
        axis: the batch axis.

    Returns:
        A scalar ``int32`` tensor.

    Raises:
        RuntimeError: called outside the step (in the cross-replica context).

    Example:
    ```python
    import keras
    import mirrorkit as mk

    # in compute_loss: this replica's queries against the global batch's candidates
    def in_batch_labels(queries, candidates):
        gathered = mk.all_gather(candidates)
        positives = mk.all_gather_offset(queries) + keras.ops.arange(keras.ops.shape(queries)[0])
        return keras.ops.one_hot(positives, keras.ops.shape(gathered)[0])  # the diagonal, moved
    ```
    """
    context = _replica_context("all_gather_offset")
    if context is None:
        return tf.constant(0, tf.int32)
    part = tf.nest.flatten(value)[0]
    size = tf.shape(part, out_type=tf.int32)[axis : axis + 1]
    sizes = context.all_gather(size, axis=0)
    replica = tf.cast(context.replica_id_in_sync_group, tf.int32)
    return loss_forms.mark(tf.reduce_sum(sizes[:replica]), loss_forms.CONST)
