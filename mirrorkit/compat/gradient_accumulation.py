"""Repair: optimizer ``gradient_accumulation_steps`` under several replicas.

Upstream: no report found; docs: compat/#gradient_accumulation_steps.
Keras 3 optimizers accumulate gradients for K steps when built with
``gradient_accumulation_steps=K``, but
``BaseOptimizer._backend_apply_gradients`` picks between "apply" and
"accumulate" with a ``cond`` in the replica context, and both branches
synchronise the replicas (the all-reduce and ``extended.update`` go through
``merge_call``). Under `tf.distribute.MirroredStrategy` with two or more
replicas ``fit`` fails with "`merge_call` called while defining a new graph"
(Keras 3.15.1, TensorFlow 2.21).

The replacement keeps Keras's mechanism (its accumulator variables, its
``iterations`` counting and its update step) and moves the ``cond`` to where
it may synchronise: each replica adds its own gradients to its own copy of
the accumulators, then one ``merge_call`` enters the cross-replica context,
where the ``cond`` either stores the local sums or, on every K-th step,
all-reduces the K-step averages ONCE (one ``batch_reduce_to``: a mean in
``fit``'s step, where losses are one device's, `mirrorkit.compat.one_device_loss`;
a sum elsewhere, as Keras's own all-reduce), applies weight
decay and the optimizer's update step, and clears the accumulators. So each
replica trains on K micro-batches and the replicas communicate once per
optimizer step; the result equals one step on the K-times larger global
batch. Gradient clipping acts on the all-reduced K-step average, as one
device clips the gradient of the K-times larger batch
(`mirrorkit.compat.one_device_gradient`). Elsewhere (one
replica, no accumulation, or a cross-replica caller) Keras's own method runs
unchanged. Verified on Keras 3.15.1 (TensorFlow 2.21).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from mirrorkit import internals
from mirrorkit.cluster.workers import spans_replicas
from mirrorkit.compat.one_device_gradient import clip_summed, clips
from mirrorkit.patching import fit_step
from mirrorkit.patching.repair import Repair


def _needs_repair(optimizer) -> bool:
    if not optimizer.gradient_accumulation_steps or not tf.distribute.has_strategy():
        return False
    if tf.distribute.in_cross_replica_context():
        return False
    return spans_replicas(tf.distribute.get_strategy())


def _tf_variable(variable):
    return variable.value if isinstance(variable, keras.Variable) else variable


#: The optimizer's private names the replacement uses (Keras 3.10-3.15).
_INTERNALS = (
    "_accumulated_gradients",
    "_get_variable_index",
    "_iterations",
    "_distributed_tf_update_step",
    "_use_weight_decay",
)


def _check_internals(optimizer) -> None:
    for attr in _INTERNALS:
        internals.require(
            optimizer,
            attr,
            name=f"keras optimizer.{attr}",
            used_for="the gradient_accumulation repair (gradient_accumulation_steps with "
            "several replicas)",
        )


def _replacement(original):
    def _backend_apply_gradients(self, grads, trainable_variables):
        if not _needs_repair(self):
            return original(self, grads, trainable_variables)
        _check_internals(self)
        if self.use_ema:
            raise ValueError(
                "gradient_accumulation_steps together with use_ema=True is not supported with "
                f"{tf.distribute.get_strategy().num_replicas_in_sync} replicas: Keras's EMA "
                "update cannot run across replicas inside the accumulation step. Drop use_ema, "
                "or keep the accumulation and average the weights in a callback."
            )
        steps = self.gradient_accumulation_steps
        accumulators = [
            self._accumulated_gradients[self._get_variable_index(v)] for v in trainable_variables
        ]
        # Replica context: this replica's gradients plus its own accumulators.
        sums = [
            tf.convert_to_tensor(g) + tf.cast(_tf_variable(a), g.dtype)
            for g, a in zip(grads, accumulators, strict=True)
        ]
        averages = [s / steps for s in sums]
        variables = [_tf_variable(v) for v in trainable_variables]
        slots = [_tf_variable(a) for a in accumulators]

        def cross_replica(distribution, sums, averages):
            is_update_step = (self._iterations + 1) % steps == 0

            def apply():
                # fit's step averages the replicas' gradients (compat.one_device_loss)
                reduce_op = tf.distribute.ReduceOp
                op = reduce_op.MEAN if fit_step.active() else reduce_op.SUM
                reduced = distribution.extended.batch_reduce_to(
                    op, list(zip(averages, variables, strict=True))
                )
                if clips(self):
                    # As one device clips: the K-step average of the global batch.
                    reduced = clip_summed(self, [tf.convert_to_tensor(g) for g in reduced])
                _cross_replica_weight_decay(self, distribution, variables)
                self._distributed_tf_update_step(
                    distribution, list(zip(reduced, variables, strict=True)), self.learning_rate
                )
                for slot in slots:
                    distribution.extended.update(
                        slot, lambda s: s.assign(tf.zeros_like(s)), group=False
                    )

            def accumulate():
                for slot, local in zip(slots, sums, strict=True):
                    distribution.extended.update(
                        slot, lambda s, v: s.assign(v), args=(local,), group=False
                    )

            tf.cond(is_update_step, apply, accumulate)

        tf.distribute.get_replica_context().merge_call(cross_replica, args=(sums, averages))

    _backend_apply_gradients.__wrapped__ = original
    return _backend_apply_gradients


def _cross_replica_weight_decay(self, distribution, variables) -> None:
    """Keras's ``TFOptimizer._apply_weight_decay``, called from the cross-replica context."""
    if self.weight_decay is None:
        return

    def decay(variable):
        lr = tf.cast(self.learning_rate, variable.dtype)
        wd = tf.cast(self.weight_decay, variable.dtype)
        variable.assign_sub(variable * wd * lr)

    for variable in variables:
        if self._use_weight_decay(variable):
            distribution.extended.update(variable, decay, group=False)


REPAIR = Repair(
    name="gradient_accumulation",
    upstream="gradient_accumulation_steps under a strategy "
    "(docs: compat/#gradient_accumulation_steps)",
    module="keras.src.backend.tensorflow.optimizer",
    target="TFOptimizer._backend_apply_gradients",
    replacement=_replacement,
    applies_to=spans_replicas,
    account="gradient_accumulation_steps",
    tests=(
        "tests/test_accumulation.py::test_keras_alone_fails_under_two_replicas",
        "tests/test_accumulation.py::test_accumulating_on_two_replicas_equals_one_big_step_on_one_device",
    ),
)
