"""Repairs: the optimizer step across replicas, one ordered pipeline from gradients to update.

Upstream: keras-team/keras#19891 (loss scaling under tf.distribute) for the
averaging; no report found for the rest (docs: compat/#the-optimizer-step-across-replicas).
Keras's TensorFlow optimizer (Keras 3.10-3.16) under N replicas:

- clips each replica's own gradient before the all-reduce (``clipnorm``,
  ``global_clipnorm``, ``clipvalue``), where one device clips the global batch's;
- all-reduces an ``IndexedSlices`` gradient by concatenating the replicas' slices
  (Adam and the others then square each replica's slice on its own);
- fails with ``gradient_accumulation_steps`` and with ``use_ema=True`` plus
  ``ema_overwrite_frequency`` (before Keras 3.16): both choose with a ``cond`` in
  the replica context whose branches synchronise the replicas ("`merge_call`
  called while defining a new graph");
- in a ``LossScaleOptimizer`` (``mixed_float16``) decides whether to skip an
  overflowing step from the first local replica's gradients: another replica's
  overflow is applied (NaN weights), and across workers one skips while the
  other waits in the all-reduce (a hang).

The repair replaces the optimizer's apply, in a replica context of a strategy
that spans replicas, with one pipeline whose stages run in the order of
`mirrorkit.compat.step_record.STAGES` (those an optimizer needs;
``step_record.ran`` lists the last step's, and the chief says them once):

1. average: inside ``fit``'s step, where every loss is one device's
   (`mirrorkit.compat.one_device_loss`), each replica's gradient divided by N;
2. accumulate: with ``gradient_accumulation_steps=K``, added to this replica's
   own accumulators; the stages below run on every K-th step, on the K-step
   average (one ``merge_call``, then a ``cond`` in the cross-replica context);
3. all-reduce: ONE collective for the step, through the optimizer's
   ``_all_reduce_sum_gradients`` and so the gradient hooks
   (`mirrorkit.training.gradient_hooks`: compression, `NaNGuard`'s check, the
   step clock), with the riders of other checks in it;
4. loss scale: a ``LossScaleOptimizer`` skips the step on every replica and
   worker together when the summed gradients are not finite (an overflow on any
   replica, or in a float16 all-reduce), and updates its scale as Keras does;
5. merge slices: the replicas' slices of each id of a sparse matmul's gradient
   summed into one (`mirrorkit.compat.gradient_sums`);
6. clip: Keras's own clipping, on the all-reduced gradient;
7. weight decay and 8. update: Keras's own, once per variable (``update_step``
   gets the Keras variable, as on one device);
9. EMA: Keras's moving averages, and the overwrite every
   ``ema_overwrite_frequency`` steps from the cross-replica context.

One collective per step, the gradients' own, carries everything; with mixed
precision AND accumulation the finite check needs a small one of its own on
every micro-step. Custom loops that call ``strategy.run`` keep TensorFlow's
contract: the gradients are summed (not averaged), then merged and clipped.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import keras
import tensorflow as tf

from mirrorkit import internals
from mirrorkit.cluster.workers import spans_replicas
from mirrorkit.compat import gradient_sums, loss_scale_check
from mirrorkit.compat.step_record import Step, step_for
from mirrorkit.patching import fit_step
from mirrorkit.patching.repair import Repair

_OPTIMIZER = "keras.src.backend.tensorflow.optimizer"
_USED_FOR = "the optimizer_step repair (one device's optimizer step on several replicas)"

#: The optimizer's private names the pipeline calls (Keras 3.10-3.16).
_INTERNALS = (
    "_distribution_strategy",
    "_apply_weight_decay",
    "_update_model_variables_moving_average",
    "_overwrite_model_variables_with_average_value",
    "_trainable_variables",
)
_ACCUMULATING = ("_accumulated_gradients", "_get_variable_index", "_iterations")
_LOSS_SCALE = ("_stateful_handle_finite_grads",)

#: While > 0, the gradients the optimizer applies are all-reduced already (loss scale's apply).
_reduced_depth = [0]
_lock = threading.Lock()


@contextlib.contextmanager
def _already_reduced() -> Iterator[None]:
    with _lock:
        _reduced_depth[0] += 1
    try:
        yield
    finally:
        with _lock:
            _reduced_depth[0] -= 1


def _spanning_replica_context() -> bool:
    if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
        return False
    return tf.distribute.get_replica_context() is not None and spans_replicas(
        tf.distribute.get_strategy()
    )


def _tf_variable(variable: Any) -> Any:
    return variable.value if isinstance(variable, keras.Variable) else variable


def _check_step(optimizer: Any) -> None:
    for attr in _INTERNALS:
        internals.require(optimizer, attr, name=f"keras optimizer.{attr}", used_for=_USED_FOR)


def _check_accumulating(optimizer: Any) -> None:
    for accumulating in _ACCUMULATING:
        name = f"keras optimizer.{accumulating}"
        internals.require(optimizer, accumulating, name=name, used_for=_USED_FOR)


def _check_loss_scale(optimizer: Any) -> None:
    for scaling in _LOSS_SCALE:
        name = f"keras LossScaleOptimizer.{scaling}"
        internals.require(optimizer, scaling, name=name, used_for=_USED_FOR)


# -- the stages after the all-reduce ------------------------------------------------


def _apply_reduced(step: Step, grads: list, variables: list, merge: list[bool]) -> None:
    """Merge slices, clip, weight decay and update, in a replica context.

    `variables` are the Keras variables (Keras's weight decay reads them, Muon's their
    paths); the update step gets TensorFlow's, as Keras's own ``_backend_update_step`` does.
    """
    optimizer = step.optimizer
    if any(merge):
        grads = [
            gradient_sums.one_slice_per_id(g) if m and g is not None else g
            for g, m in zip(grads, merge, strict=True)
        ]
        step.did("merge slices")
    if gradient_sums.clips(optimizer):
        grads = gradient_sums.clip_reduced(optimizer, grads, used_for=_USED_FOR)
        kinds = ("clipnorm", "global_clipnorm", "clipvalue")
        step.did("clip", ", ".join(k for k in kinds if getattr(optimizer, k)))
    if optimizer.weight_decay is not None:
        optimizer._apply_weight_decay(variables)
        step.did("weight decay")
    tf.__internal__.distribute.interim.maybe_merge_call(
        _updated, optimizer._distribution_strategy, optimizer, grads, variables
    )
    step.did("update")


def _updated(distribution, optimizer, grads, variables) -> None:
    """Keras's ``update_step`` once per variable, in the cross-replica context.

    Each call gets the Keras variable, as on one device (Keras 3.10's ``Muon`` reads its
    ``path``; Keras's own ``_distributed_tf_update_step`` hands TensorFlow's instead); its
    reads and writes reach the variable's copy on the device being updated.
    """
    for grad, variable in zip(grads, variables, strict=True):
        distribution.extended.update(
            _tf_variable(variable),
            lambda _, grad, learning_rate, variable=variable: optimizer.update_step(
                grad, variable, learning_rate
            ),
            args=(grad, optimizer.learning_rate),
            group=False,
        )


def _reduce_and_apply(step: Step, grads: list, variables: list) -> None:
    """All-reduce, then the stages after it (replica context)."""
    merge = [gradient_sums.summed_per_id(g) for g in grads]
    tf_variables = [_tf_variable(v) for v in variables]
    reduced, _ = gradient_sums.all_reduce(
        step.optimizer, grads, tf_variables, {}, used_for=_USED_FOR
    )
    step.did("all-reduce", _reducer(step.optimizer))
    _apply_reduced(step, reduced, variables, merge)


#: How the notice names mirrorkit's own gradient hooks; the step clock changes no number.
_HOOK_WORDS = {"compression": "compression", "nan_guard": "NaNGuard's check", "step_clock": ""}


def _reducer(optimizer: Any) -> str:
    """What acts in the all-reduce: the gradient hooks that change or check the gradients."""
    chain = vars(optimizer).get(gradient_sums.ALL_REDUCE)
    hooks = getattr(chain, "hooks", None) or {}  # mirrorkit.training.gradient_hooks' chain
    words = {_HOOK_WORDS.get(name.split(".")[0], name) for name in hooks}
    return ", ".join(sorted(word for word in words if word))


def _ema(step: Step) -> None:
    """Keras's moving averages, and the overwrite every ``ema_overwrite_frequency`` steps."""
    optimizer = step.optimizer
    if not optimizer.use_ema:
        return
    optimizer._update_model_variables_moving_average(optimizer._trainable_variables)
    frequency = optimizer.ema_overwrite_frequency
    if not frequency:
        step.did("ema")
        return
    variables = optimizer._trainable_variables

    def cross_replica(distribution):
        # In the cross-replica context, where the overwrite's extended.update may run.
        overwrite = (optimizer.iterations + 1) % frequency == 0
        tf.cond(
            overwrite,
            lambda: _no_value(optimizer._overwrite_model_variables_with_average_value(variables)),
            lambda: None,
        )

    tf.distribute.get_replica_context().merge_call(cross_replica)
    step.did("ema", f"overwritten every {frequency} steps")


def _no_value(_result: Any) -> None:
    return None


# -- accumulation ---------------------------------------------------------------------


def _accumulate(step: Step, grads: list, variables: list) -> None:
    """Adds to this replica's accumulators; every K-th step, the rest on the K-step average."""
    optimizer = step.optimizer
    _check_accumulating(optimizer)
    steps = optimizer.gradient_accumulation_steps
    accumulators = [
        _tf_variable(optimizer._accumulated_gradients[optimizer._get_variable_index(v)])
        for v in variables
    ]
    sums = [
        tf.convert_to_tensor(g) + tf.cast(a, g.dtype)
        for g, a in zip(grads, accumulators, strict=True)
    ]
    step.did("accumulate", f"{steps} steps")

    def finish(sums):  # in each replica, every K-th step
        _reduce_and_apply(step, [s / steps for s in sums], variables)
        tf.__internal__.distribute.interim.maybe_merge_call(
            _cleared, optimizer._distribution_strategy, accumulators
        )

    def cross_replica(distribution, sums):
        def apply():
            distribution.extended.call_for_each_replica(finish, args=(sums,))

        def store():
            for slot, local in zip(accumulators, sums, strict=True):
                distribution.extended.update(
                    slot, lambda s, v: s.assign(v), args=(local,), group=False
                )

        tf.cond((optimizer._iterations + 1) % steps == 0, apply, store)

    tf.distribute.get_replica_context().merge_call(cross_replica, args=(sums,))


def _cleared(distribution, accumulators) -> None:
    for slot in accumulators:
        distribution.extended.update(slot, lambda s: s.assign(tf.zeros_like(s)), group=False)


# -- the repairs ----------------------------------------------------------------------


def _apply_gradients(original):
    def _backend_apply_gradients(self, grads, trainable_variables):
        if not _spanning_replica_context():
            return original(self, grads, trainable_variables)
        _check_step(self)
        step = step_for(self)
        variables = list(trainable_variables)
        if _reduced_depth[0]:  # a LossScaleOptimizer's apply: averaged and all-reduced already
            _apply_reduced(step, list(grads), variables, [False] * len(variables))
        else:
            replicas = fit_step.averaging_replicas()
            if replicas > 1:
                grads = [gradient_sums.divided(g, replicas) for g in grads]
                step.did("average", f"over {replicas} replicas")
            if self.gradient_accumulation_steps:
                _accumulate(step, list(grads), variables)
            else:
                _reduce_and_apply(step, list(grads), variables)
        _ema(step)
        step.done()

    _backend_apply_gradients.__wrapped__ = original
    return _backend_apply_gradients


def _loss_scaled_apply(original):
    def _tf_apply(self, grads, trainable_variables=None):
        context = tf.distribute.get_replica_context()
        spanning = tf.distribute.has_strategy() and spans_replicas(tf.distribute.get_strategy())
        if context is None or not (spanning or loss_scale_check.riders(self)):
            return original(self, grads, trainable_variables)
        _check_loss_scale(self)
        inner = self.inner_optimizer
        step = step_for(inner)
        # Where this step's loss was scaled by the scale / N (`_scale_loss`), the gradients
        # are averaged already, and no larger in float16 than one device's share of them; a
        # custom train_step that never called scale_loss has them averaged here.
        replicas = fit_step.averaging_replicas()
        in_the_loss = loss_scale_check.divided_in_the_loss(self)
        if inner.gradient_accumulation_steps:  # the check every micro-step, the sum every K-th
            step.did("loss scale", "agreed on every micro-step")
            finite = loss_scale_check.agreed_finite(self, grads)
            if replicas > 1 and in_the_loss:
                grads = [gradient_sums.multiplied(g, replicas) for g in grads]
            loss_scale_check.skip_or_apply(self, finite, grads, trainable_variables, _apply)
            return None
        step.did("loss scale", "a step skipped on every replica when the sum is not finite")
        variables = [_tf_variable(v) for v in (trainable_variables or inner._trainable_variables)]
        # All-reduced unscaled (a power of two: exact), so that a 16-bit all-reduce does not
        # overflow on the scale; scaled again for Keras's own finite branch, which unscales.
        scale = tf.convert_to_tensor(self.dynamic_scale)
        divisor = scale if in_the_loss else scale * replicas
        grads = [gradient_sums.divided(g, divisor) for g in grads]
        if replicas > 1:
            where = "in the scaled loss" if in_the_loss else "with the loss scale"
            step.did("average", f"over {replicas} replicas, {where}")
        reduced, riders = gradient_sums.all_reduce(
            inner, list(grads), variables, loss_scale_check.local(self), used_for=_USED_FOR
        )
        step.did("all-reduce", ", ".join(filter(None, [_reducer(inner), *riders])))
        loss_scale_check.verdicts(self, riders)
        finite = self.check_finite(reduced)  # an overflow anywhere is not finite in the sum
        reduced = [gradient_sums.multiplied(g, scale) for g in reduced]
        apply = _apply_reduced_grads
        loss_scale_check.skip_or_apply(self, finite, reduced, trainable_variables, apply)
        return None

    _tf_apply.__wrapped__ = original
    return _tf_apply


def _apply(loss_scale: Any, grads: list, trainable_variables: Any) -> None:
    """Keras's finite branch: unscaled, applied by the inner optimizer, the scale grown."""
    loss_scale._stateful_handle_finite_grads(grads, trainable_variables)


def _apply_reduced_grads(loss_scale: Any, grads: list, trainable_variables: Any) -> None:
    """The same with gradients that are all-reduced already (the pipeline skips its own)."""
    with _already_reduced():
        loss_scale._stateful_handle_finite_grads(grads, trainable_variables)


#: The tests of these repairs (docs: development/#repairs-and-tests is made from them).
TESTS = (
    "tests/test_optimizer_step.py::test_ema_overwrite_fails_on_two_replicas_upstream",
    "tests/test_optimizer_step.py::test_every_recipe_pair_trains_as_one_device",
    "tests/test_optimizer_step.py::test_recipes_on_two_workers_with_an_overflow_on_worker_one",
    "tests/test_clipping.py::test_fit_clips_the_averaged_gradient_as_one_device",
    "tests/test_sparse_gradients.py::test_a_dense_layer_on_sparse_inputs_trains_as_one_device",
    "tests/test_accumulation.py::test_accumulating_on_two_replicas_equals_one_big_step_on_one_device",
    "tests/test_mixed_precision.py::test_an_overflow_on_replica_one_is_skipped_on_every_replica_as_on_one_device",
)

STEP = Repair(
    name="optimizer_step",
    upstream="the optimizer step under several replicas: clipping, sparse slices, "
    "gradient_accumulation_steps and ema_overwrite_frequency "
    "(docs: compat/#the-optimizer-step-across-replicas)",
    module=_OPTIMIZER,
    target="TFOptimizer._backend_apply_gradients",
    replacement=_apply_gradients,
    applies_to=spans_replicas,
    account="the-optimizer-step-across-replicas",
    tests=TESTS,
)
LOSS_SCALE = Repair(
    name="optimizer_step_loss_scale",
    upstream="LossScaleOptimizer._tf_apply decides from one replica "
    "(docs: compat/#mixed-precision-across-replicas)",
    module="keras.src.optimizers.loss_scale_optimizer",
    target="LossScaleOptimizer._tf_apply",
    replacement=_loss_scaled_apply,
    applies_to=spans_replicas,
    account="mixed-precision-across-replicas",
    tests=(
        "tests/test_mixed_precision.py::test_keras_alone_applies_replica_ones_overflow",
        "tests/test_mixed_precision.py::test_an_overflow_on_replica_one_is_skipped_on_every_replica_as_on_one_device",
        "tests/test_mixed_precision.py::test_without_an_overflow_two_replicas_equal_one_device_at_every_step",
    ),
)

SCALED_LOSS = Repair(
    name="optimizer_step_scaled_loss",
    upstream="LossScaleOptimizer.scale_loss scales each replica's one-device loss by the whole "
    "scale (docs: compat/#mixed-precision-across-replicas)",
    module="keras.src.optimizers.loss_scale_optimizer",
    target="LossScaleOptimizer.scale_loss",
    replacement=loss_scale_check.scaled_loss,
    applies_to=spans_replicas,
    account="mixed-precision-across-replicas",
    tests=(
        "tests/test_mixed_precision.py::test_without_an_overflow_the_scale_skips_what_one_device_skips",
        # its canary: without it, 2 replicas skip the first step
        "tests/test_mixed_precision.py::test_the_whole_scale_skips_a_step_one_device_does_not_upstream",
    ),
)

REPAIRS = (STEP, LOSS_SCALE, SCALED_LOSS)
