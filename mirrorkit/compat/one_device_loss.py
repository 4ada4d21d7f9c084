"""Repair: inside ``fit``'s step every loss is one device's, and gradients are averaged.

Upstream: Keras's loss scaling for tf.distribute (keras-team/keras#19891,
fixed in 3.7-3.8 by #20541/#20609/#20610 for Keras's own ``train_step``);
docs: compat/#losses-in-your-own-train_step. Under N replicas Keras
divides the loss of its ``keras.losses`` objects and ``compute_loss`` by N
and its optimizer sums the replicas' gradients. A custom ``train_step`` that
reduces its loss by hand (the keras.io VAE's ``ops.mean`` of
``keras.losses.binary_crossentropy``, WGAN-GP's ``tf.reduce_mean``
expressions) is not divided, so it trains at N times one device's gradient,
silently; one that logs a Keras loss logs 1/N of one device's value.

The repair changes where the 1/N is applied, only while a replica runs a
step ``fit``, ``evaluate``, ``train_on_batch`` or ``test_on_batch`` made
(`mirrorkit.patching.fit_step`): Keras's loss scaling and unscaling do
nothing there, ``sum``-reduced Keras losses are multiplied by N (so that the
replicas' mean is the global sum one device computes) and a replica's loss
of no examples is 0, ``tf.nn``'s
``compute_average_loss`` and ``scale_regularization_loss`` return one
device's value, and the optimizer divides each replica's gradients by N
before its summing all-reduce (`mirrorkit.compat.optimizer_step`); a loss that
sums over the batch is weighted by N (`mirrorkit.compat.one_device_tape`).
Every loss a step computes is then one device's loss on its part of the
batch and every gradient is one device's; custom loops outside ``fit`` keep
TensorFlow's contract. Where the split is uneven
``mk.distribute`` drops the remainder, as averaging equal shares needs.
"""

from __future__ import annotations

import tensorflow as tf

from mirrorkit.cluster.workers import spans_replicas
from mirrorkit.compat import loss_forms, loss_reader
from mirrorkit.patching import fit_step
from mirrorkit.patching.repair import Repair

_TRAINER = "keras.src.backend.tensorflow.trainer"
_LOSSES = "keras.src.losses.loss"
_UPSTREAM = "keras-team/keras#19891 (loss scaling under tf.distribute)"


def _mark_steps(original):
    def _make_function(self, step_function):
        return original(self, fit_step.wrap(step_function, owner=self))

    _make_function.__wrapped__ = original
    return _make_function


def _unchanged_in_step(original):
    """For Keras's ``(un)scale_loss_for_distribution``: nothing to do inside a step."""

    def replacement(value):
        return value if fit_step.active() else original(value)

    replacement.__name__ = original.__name__
    replacement.__wrapped__ = original
    return replacement


def _times_replicas(value):
    replicas = fit_step.replicas()
    return value if replicas == 1 else value * tf.cast(replicas, value.dtype)


def _reduced_as_one_device(original):
    def reduce_values(values, sample_weight=None, reduction="sum_over_batch_size"):
        loss = original(values, sample_weight, reduction)
        if not fit_step.active() or reduction in (None, "none"):
            return loss
        if tuple(values.shape) == (0,):
            # A replica whose part of the batch is empty: Keras hands the empty values back
            # unreduced when their shape is known (keras-nightly 3.16 traces the first step
            # with the first batch's own shapes), and its loss tracker then reads NaN. One
            # device's loss of no examples is 0, as Keras's divide_no_nan gives it otherwise
            # (the sum of the empty values: its gradient is zeros, not missing).
            return tf.reduce_sum(values)
        if tuple(values.shape) == ():
            # A loss function that reduced by itself (``tf.reduce_sum(...)`` in a function
            # given to compile): Keras hands it back as it is, so read what it is.
            return _read_scalar(loss)
        if reduction == "sum":
            return loss_forms.mark(_times_replicas(loss), loss_forms.MEAN)
        if reduction == "mean_with_sample_weight" and sample_weight is not None:
            loss = _weighted_mean_of_the_global_batch(values, sample_weight, loss.dtype)
        return loss_forms.mark(loss, loss_forms.MEAN)

    reduce_values.__wrapped__ = original
    return reduce_values


def _read_scalar(loss):
    """A scalar loss one device's: a sum over the batch times N, a mean as it is."""
    reader = loss_reader.reader()
    form = reader.read(loss) if reader is not None else loss_forms.UNKNOWN
    if form.kind == "sum":
        return loss_forms.mark(_times_replicas(loss), loss_forms.MEAN)
    if form.kind in ("mean", "const", "replicated"):
        return loss_forms.mark(loss, loss_forms.MEAN)
    return loss  # left to the tape, which says what it cannot read


def _weighted_mean_of_the_global_batch(values, sample_weight, dtype):
    """``reduction="mean_with_sample_weight"``: the weighted sum over the sum of the weights.

    Each replica's ratio of its own sums is not one device's ratio of the global batch's, and
    the replicas' mean of their ratios is not either. Divided by the mean over the replicas of
    their weights' sums (one small all-reduce), each replica's loss is N times its share of
    one device's, and their mean is one device's loss.
    """
    total = tf.reduce_sum(values)
    weights = tf.cast(tf.reduce_sum(sample_weight), dtype)
    context = tf.distribute.get_replica_context()
    if context is not None and context.num_replicas_in_sync > 1:
        weights = context.all_reduce(tf.distribute.ReduceOp.MEAN, weights)
    return tf.math.divide_no_nan(total, weights)


def _average_loss_as_one_device(original):
    def compute_average_loss(per_example_loss, sample_weight=None, global_batch_size=None):
        loss = original(
            per_example_loss, sample_weight=sample_weight, global_batch_size=global_batch_size
        )
        if not fit_step.active():
            return loss
        return loss_forms.mark(_times_replicas(loss), loss_forms.MEAN)

    compute_average_loss.__wrapped__ = original
    compute_average_loss.__doc__ = original.__doc__
    return compute_average_loss


def _regularization_as_one_device(original):
    def scale_regularization_loss(regularization_loss):
        loss = original(regularization_loss)
        if not fit_step.active():
            return loss
        return loss_forms.mark(_times_replicas(loss), loss_forms.MEAN)

    scale_regularization_loss.__wrapped__ = original
    scale_regularization_loss.__doc__ = original.__doc__
    return scale_regularization_loss


#: The failure's account on the Keras repairs page (docs: compat/), and the tests of
#: this module's repairs (docs: development/#repairs-and-tests is made from them).
_ACCOUNT = "losses-in-your-own-train_step"
TESTS = (
    "tests/test_own_train_step.py::test_a_loss_reduced_by_hand_trains_at_twice_the_gradient_upstream",
    "tests/test_own_train_step.py::test_a_loss_reduced_by_hand_trains_as_one_device",
    "tests/test_own_train_step.py::test_tf_nn_compute_average_loss_in_a_step_trains_as_one_device",
    "tests/test_own_train_step.py::test_a_summed_loss_trains_as_one_device",
    "tests/test_own_train_step.py::test_a_custom_loop_outside_fit_keeps_tensorflow_contract",
    "tests/test_check_equivalence.py::test_custom_train_steps_that_average_by_hand_or_log_keras_losses_pass",
    "tests/test_check_equivalence.py::test_the_guide_step_logs_one_device_loss_and_is_told_so",
    "tests/test_keras_io_examples.py::test_own_training_steps_on_two_workers_as_one_device[custom_train_step]",
    "tests/test_keras_io_examples.py::test_own_training_steps_on_two_workers_as_one_device[knowledge_distillation]",
    "tests/test_keras_io_examples.py::test_own_training_steps_on_two_workers_as_one_device[subclassing_add_loss]",
)


#: Its own canary: the loss form that fails with this one repair alone taken off.
ALONE = "tests/test_loss_forms.py::test_a_loss_repair_taken_off_alone_fails_as_keras_does_upstream"


def _repair(name: str, module: str, target: str, replacement, canary: str = ALONE) -> Repair:
    """One repair of this family, with its own canary.

    `canary`: `ALONE` (its case of that test, named after it) or another upstream test's
    node id.
    """
    return Repair(
        name=name,
        upstream=_UPSTREAM,
        module=module,
        target=target,
        replacement=replacement,
        applies_to=spans_replicas,
        account=_ACCOUNT,
        tests=(_canary_case(canary, name), *TESTS),
    )


def _canary_case(canary: str, name: str) -> str:
    return f"{canary}[{name}]" if canary == ALONE else canary


REPAIRS = (
    _repair("one_device_step", _TRAINER, "TensorFlowTrainer._make_function", _mark_steps),
    _repair("one_device_loss_scale", _LOSSES, "scale_loss_for_distribution", _unchanged_in_step),
    _repair(
        "one_device_loss_unscale", _LOSSES, "unscale_loss_for_distribution", _unchanged_in_step
    ),
    _repair("one_device_reduction", _LOSSES, "reduce_values", _reduced_as_one_device),
    _repair(
        "one_device_average_loss",
        "tensorflow",
        "nn.compute_average_loss",
        _average_loss_as_one_device,
        canary="tests/test_own_train_step.py::"
        "test_tf_nn_compute_average_loss_in_a_step_logs_a_replicas_share_upstream",
    ),  # fmt: skip
    _repair(
        "one_device_regularization_loss",
        "tensorflow",
        "nn.scale_regularization_loss",
        _regularization_as_one_device,
    ),
)
