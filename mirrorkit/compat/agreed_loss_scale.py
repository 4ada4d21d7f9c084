"""Repair: mixed precision skips an overflowing step on every replica and worker together.

Upstream: ``LossScaleOptimizer._tf_apply`` (Keras 3.10-3.15.1,
keras/src/optimizers/loss_scale_optimizer.py); no report found
(docs: compat/#mixed-precision-across-replicas). With
``mixed_float16`` Keras wraps the optimizer in a ``LossScaleOptimizer``: a
step whose scaled gradients are not finite is skipped and the loss scale
halved. Under a strategy Keras decides that from the *first local replica's*
gradients, before they are all-reduced (its comment assumes they already
were). An overflow on another replica is then applied: every weight is NaN
from that step on. Across workers each worker decides from its own first
replica, so one skips while the other waits in the gradient all-reduce: the
job hangs.

The replacement takes the decision from every replica: each replica flags
whether its own gradients are finite, the flags are summed in one small
all-reduce (a float per replica, across workers too), and every replica of
every worker skips or applies together, as one device does on the global
batch. The skip, the scale's update and ``iterations`` then equal one
device's whichever replica overflows. Keras's own two branches
(``_stateful_handle_finite_grads``, ``_stateful_handle_non_finite_grads``)
run unchanged.

`add_rider` lets another check travel in the same all-reduce (`NaNGuard`
reads each replica's loss there: a skipped step never reaches the gradient
all-reduce where it otherwise looks); an optimizer with a rider takes this
path on one replica too, where `NaNGuard` puts the repair in place itself.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from mirrorkit import internals
from mirrorkit.cluster.workers import spans_replicas
from mirrorkit.patching.repair import Repair

_MODULE = "keras.src.optimizers.loss_scale_optimizer"
_USED_FOR = "the agreed_loss_scale repair (mixed precision on several replicas)"

#: The optimizer's private names the replacement calls (Keras 3.10-3.15).
_INTERNALS = ("_stateful_handle_finite_grads", "_stateful_handle_non_finite_grads")

#: Extra flags summed with the finite check: optimizer -> {name: (local_fn, verdict_fn)}.
_RIDERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def add_rider(
    optimizer: Any,
    name: str,
    local: Callable[[], tf.Tensor],
    verdict: Callable[[tf.Tensor], None],
) -> None:
    """Sums every replica's ``local()`` in the finite check and hands the sum to `verdict`.

    Args:
        optimizer: the ``LossScaleOptimizer``.
        name: the rider's name (one per name; a second replaces the first).
        local: called in each replica before the check: a 1-D float32 tensor.
        verdict: called in each replica with the sum over every replica.
    """
    _RIDERS.setdefault(optimizer, {})[name] = (local, verdict)


def remove_rider(optimizer: Any, name: str) -> None:
    """Takes the rider `name` off `optimizer` (nothing if it is not there)."""
    riders = _RIDERS.get(optimizer)
    if riders is not None:
        riders.pop(name, None)


def agreed_finite(optimizer: Any, grads) -> tf.Tensor:
    """Whether every replica's `grads` are finite: the same answer on every replica and worker.

    Called in a replica context; one all-reduce of a float per replica (and the riders).

    Args:
        optimizer: the ``LossScaleOptimizer`` (its ``check_finite`` judges each replica).
        grads: this replica's gradients.

    Returns:
        A scalar boolean tensor.
    """
    local_ok = optimizer.check_finite(grads)
    riders = list(_RIDERS.get(optimizer, {}).values())
    parts = [tf.reshape(1.0 - tf.cast(local_ok, tf.float32), [1])]
    parts += [tf.reshape(tf.cast(local(), tf.float32), [-1]) for local, _ in riders]
    sizes = [int(part.shape[0]) for part in parts]
    summed = tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM, tf.concat(parts, axis=0)
    )
    pieces = tf.split(summed, sizes)
    for (_, verdict), piece in zip(riders, pieces[1:], strict=True):
        verdict(piece)
    return tf.equal(pieces[0][0], 0.0)


def _replacement(original):
    def _tf_apply(self, grads, trainable_variables=None):
        context = tf.distribute.get_replica_context()
        spanning = tf.distribute.has_strategy() and spans_replicas(tf.distribute.get_strategy())
        if context is None or not (spanning or _RIDERS.get(self)):
            return original(self, grads, trainable_variables)
        for attr in _INTERNALS:
            name = f"keras LossScaleOptimizer.{attr}"
            internals.require(self, attr, name=name, used_for=_USED_FOR)
        finite = agreed_finite(self, grads)
        if tf.__internal__.distribute.strategy_supports_no_merge_call():
            tf.cond(
                finite,
                lambda: _no_value(self._stateful_handle_finite_grads(grads, trainable_variables)),
                lambda: _no_value(self._stateful_handle_non_finite_grads()),
            )
            return None

        def cross_replica(distribution, finite, grads, trainable_variables):
            # Every replica holds the same verdict: any local copy will do.
            agreed = distribution.experimental_local_results(finite)[0]

            def apply():
                distribution.extended.call_for_each_replica(
                    self._stateful_handle_finite_grads, args=(grads, trainable_variables)
                )

            # In the cross-replica context, as Keras's own: the apply branch merge_calls.
            tf.cond(agreed, apply, self._stateful_handle_non_finite_grads)

        context.merge_call(cross_replica, args=(finite, grads, trainable_variables))
        return None

    _tf_apply.__wrapped__ = original
    return _tf_apply


def _no_value(_result) -> None:
    return None


REPAIR = Repair(
    name="agreed_loss_scale",
    upstream="LossScaleOptimizer._tf_apply decides from one replica "
    "(docs: compat/#mixed-precision-across-replicas)",
    module=_MODULE,
    target="LossScaleOptimizer._tf_apply",
    replacement=_replacement,
    applies_to=spans_replicas,
    account="mixed-precision-across-replicas",
    tests=(
        "tests/test_mixed_precision.py::test_keras_alone_applies_replica_ones_overflow",
        "tests/test_mixed_precision.py::test_an_overflow_on_replica_one_is_skipped_on_every_replica_as_on_one_device",
        "tests/test_mixed_precision.py::test_without_an_overflow_two_replicas_equal_one_device_at_every_step",
    ),
)
