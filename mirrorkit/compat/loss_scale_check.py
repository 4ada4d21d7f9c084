"""A ``LossScaleOptimizer``'s decision across replicas, and the checks that ride with it.

A rider is a small float32 vector each replica computes (`NaNGuard` flags each
replica's loss) and every replica needs summed over all of them. With
``mixed_float16`` the optimizer step's one collective carries them with the
gradients (`mirrorkit.compat.optimizer_step`): a skipped step never reaches
any other all-reduce where a check could look. Where the gradients are
all-reduced only every K-th step (``gradient_accumulation_steps``), the loss
scale still decides on every micro-step, from every replica: `agreed_finite`
sums each replica's finite flag and the riders in one small collective.
`skip_or_apply` then runs Keras's own two branches on every replica together.

Inside ``fit`` each replica's loss is scaled by the scale / N (`scaled_loss`, the
``optimizer_step_scaled_loss`` repair), so that its float16 backward pass is no larger
than one device's share; `divided_in_the_loss` tells the optimizer step that the
gradients are averaged already.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from mirrorkit import internals
from mirrorkit.patching import fit_step

#: Riders by optimizer: optimizer -> {name: (local_fn, verdict_fn)}.
_RIDERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def add_rider(
    optimizer: Any,
    name: str,
    local: Callable[[], tf.Tensor],
    verdict: Callable[[tf.Tensor], None],
) -> None:
    """Sums every replica's ``local()`` in the loss scale's step and hands the sum to `verdict`.

    Args:
        optimizer: the ``LossScaleOptimizer``.
        name: the rider's name (one per name; a second replaces the first).
        local: called in each replica before the all-reduce: a 1-D float32 tensor.
        verdict: called in each replica with the sum over every replica.
    """
    _RIDERS.setdefault(optimizer, {})[name] = (local, verdict)


def remove_rider(optimizer: Any, name: str) -> None:
    """Takes the rider `name` off `optimizer` (nothing if it is not there)."""
    riders = _RIDERS.get(optimizer)
    if riders is not None:
        riders.pop(name, None)


def riders(optimizer: Any) -> tuple[str, ...]:
    """The names of the riders on `optimizer`."""
    return tuple(_RIDERS.get(optimizer, {}))


def local(optimizer: Any) -> dict[str, tf.Tensor]:
    """Each rider's value in this replica, by name (called in a replica context)."""
    return {
        name: tf.reshape(tf.cast(fn(), tf.float32), [-1])
        for name, (fn, _) in _RIDERS.get(optimizer, {}).items()
    }


def verdicts(optimizer: Any, summed: dict[str, tf.Tensor]) -> None:
    """Hands each rider its sum over every replica."""
    for name, (_, verdict) in _RIDERS.get(optimizer, {}).items():
        verdict(summed[name])


def agreed_finite(optimizer: Any, grads) -> tf.Tensor:
    """Whether every replica's `grads` are finite: the same answer on every replica and worker.

    Called in a replica context; one all-reduce of a float per replica and the riders.

    Args:
        optimizer: the ``LossScaleOptimizer`` (its ``check_finite`` judges each replica).
        grads: this replica's gradients.

    Returns:
        A scalar boolean tensor.
    """
    local_ok = optimizer.check_finite(grads)
    mine = local(optimizer)
    parts = [tf.reshape(1.0 - tf.cast(local_ok, tf.float32), [1]), *mine.values()]
    sizes = [int(part.shape[0]) for part in parts]
    summed = tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM, tf.concat(parts, axis=0)
    )
    pieces = tf.split(summed, sizes)
    verdicts(optimizer, dict(zip(mine, pieces[1:], strict=True)))
    return tf.equal(pieces[0][0], 0.0)


def skip_or_apply(
    loss_scale: Any, finite: Any, grads: list, trainable_variables: Any, apply: Callable
) -> None:
    """Every replica applies, or skips and halves the scale, together (Keras's two branches).

    Args:
        loss_scale: the ``LossScaleOptimizer``.
        finite: this replica's verdict, the same on every replica (a scalar boolean).
        grads: the gradients `apply` takes.
        trainable_variables: the variables, as given to ``apply``.
        apply: ``apply(loss_scale, grads, trainable_variables)``, the finite branch.
    """
    non_finite = internals.require(
        loss_scale,
        "_stateful_handle_non_finite_grads",
        name="keras LossScaleOptimizer._stateful_handle_non_finite_grads",
        used_for="the optimizer_step_loss_scale repair (mixed precision on several replicas)",
    )

    def apply_here(grads, trainable_variables):
        apply(loss_scale, grads, trainable_variables)

    if tf.__internal__.distribute.strategy_supports_no_merge_call():
        tf.cond(
            finite,
            lambda: _no_value(apply_here(grads, trainable_variables)),
            lambda: _no_value(non_finite()),
        )
        return

    def cross_replica(distribution, finite, grads, trainable_variables):
        agreed = distribution.experimental_local_results(finite)[0]  # the same on every replica

        def apply():
            distribution.extended.call_for_each_replica(
                apply_here, args=(grads, trainable_variables)
            )

        tf.cond(agreed, apply, non_finite)

    tf.distribute.get_replica_context().merge_call(
        cross_replica, args=(finite, grads, trainable_variables)
    )


def _no_value(_result: Any) -> None:
    return None


def scaled_loss(original):
    """The replacement of ``LossScaleOptimizer.scale_loss`` inside ``fit``: by the scale / N."""

    def scale_loss(self, loss):
        scaled = original(self, loss)
        replicas = fit_step.averaging_replicas()
        if replicas == 1 or not tf.is_tensor(scaled):
            return scaled
        # Each replica's loss is one device's loss on its part of the batch: scaled by the
        # scale / N its float16 backward pass is no larger than one device's share of it, and
        # overflows where one device's does (scaled by the whole scale it would overflow N
        # times sooner, and skip steps one device does not skip).
        _DIVIDED_LOSSES.setdefault(_graph_key(), set()).add(id(self))
        return scaled / tf.cast(replicas, scaled.dtype)

    scale_loss.__wrapped__ = original
    return scale_loss


#: The step graph -> the loss scale optimizers whose scale_loss divided a loss by N in it.
_DIVIDED_LOSSES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_EAGER = tf.Graph()  # the key of eager steps (run_eagerly=True), consumed by each apply


def _graph_key() -> Any:
    return _EAGER if tf.executing_eagerly() else tf.compat.v1.get_default_graph()


def divided_in_the_loss(loss_scale: Any) -> bool:
    """Whether `loss_scale.scale_loss` divided this step's loss by N (Keras's fit does)."""
    divided = _DIVIDED_LOSSES.get(_graph_key(), set())
    found = id(loss_scale) in divided
    if tf.executing_eagerly():
        divided.discard(id(loss_scale))
    return found
