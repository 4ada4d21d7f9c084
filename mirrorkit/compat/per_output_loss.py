"""Repair: each output's loss metric counts a batch split over replicas as one device does.

Upstream: none found; docs: compat/#per-output-loss-metrics-on-an-unevenly-split-batch.
Keras's ``CompileLoss.call`` records each output's loss of a multi-output model in a ``Mean``
metric (``out_b_loss``) weighted by the static batch size, ``y_pred.shape[0]``. Where the
batch dimension is unknown (an evaluation set whose last batch is smaller), the weight is
None, so every replica's mean counts once: a last batch of 3 split 2 + 1 over 2 replicas
weighs its examples unequally, and ``val_out_b_loss`` differs from one device's. The
replacement weighs each replica's entry by its share of the step's batch (its examples over
all replicas', one scalar all-reduce), so each batch counts once, as on one device. A known
static batch size, and a single replica, go to Keras unchanged.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from mirrorkit.cluster.workers import spans_replicas
from mirrorkit.patching import instance
from mirrorkit.patching.repair import Repair

_MODULE = "keras.src.trainers.compile_utils"
_USED_FOR = "the per_output_loss repair (each output's loss metric across replicas)"


def _by_share(update_state, share):
    def update_state_by_share(values, sample_weight=None):
        if sample_weight is not None:  # a static batch size: Keras's weight is right
            return update_state(values, sample_weight=sample_weight)
        kept = tf.where(share > 0, values, tf.zeros_like(values))  # an empty part: no NaN
        return update_state(kept, sample_weight=share)

    return update_state_by_share


def _replacement(original):
    def call(self, y_true, y_pred, sample_weight=None):
        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync < 2:
            return original(self, y_true, y_pred, sample_weight)
        if not self.built:
            self.build(y_true, y_pred)
        first = keras.tree.flatten(y_pred)[0]
        if not self.metrics or first.shape[0] is not None:
            return original(self, y_true, y_pred, sample_weight)
        mine = tf.cast(tf.shape(first)[0], tf.float32)
        share = mine / tf.maximum(context.all_reduce("SUM", mine), 1.0)
        patches = [
            instance.set_on(
                metric,
                "update_state",
                _by_share(metric.update_state, share),
                name="per_output_loss.update_state",
                reason="each output's loss metric weighs a replica by its share of the batch",
            )
            for metric in self.metrics
        ]
        try:
            return original(self, y_true, y_pred, sample_weight)
        finally:
            for patch in reversed(patches):
                instance.restore(patch)

    call.__wrapped__ = original
    return call


REPAIR = Repair(
    name="per_output_loss",
    upstream="CompileLoss weighs each output's loss metric by the static batch size",
    module=_MODULE,
    target="CompileLoss.call",
    replacement=_replacement,
    applies_to=spans_replicas,
    # Keras 3.16's CompileLoss.call calls each metric in another way, and the replacement's
    # all-reduce then makes the replicas' merge_call counts differ: there it stays off, and
    # each output's loss metric on an unevenly split batch differs from one device's, as in
    # plain Keras (its canary shows the bug is still there).
    fits_before="3.16.0",
    account="per-output-loss-metrics-on-an-unevenly-split-batch",
    tests=(
        "tests/test_compat.py::test_per_output_loss_metrics_weigh_by_the_static_batch_upstream",
        "tests/test_conformance.py::test_two_replicas[dict_uneven_last_eval_batch-evaluate]",
        "tests/test_conformance.py::test_two_replicas[dict_uneven_last_eval_batch-fit]",
        "tests/test_conformance.py::test_two_workers[dict_uneven_last_eval_batch-evaluate]",
    ),
)
