"""Repairs: a loss that sums over the batch gives one device's gradient too.

Upstream: none; this completes `mirrorkit.compat.one_device_loss` (docs:
compat/#losses-in-your-own-train_step). Inside ``fit``'s step every loss is one
device's loss on the replica's part of the batch and the optimizer averages the
replicas' gradients. That is one device's gradient for a loss that is a mean
over the batch, and 1/N of it for a loss that sums over the batch: a per-example
loss vector handed to ``tape.gradient`` (which differentiates its sum; the
keras.io Dual Encoder's ``compute_loss``), an ``ops.sum`` over the examples, an
``add_loss`` of a sum (keras.io/api/losses' activity regularizer). Plain
``MirroredStrategy``, which sums the gradients, gets those right and the means
wrong.

The repairs read each loss's form from the traced step
(`mirrorkit.compat.loss_forms`), only while a replica runs a step ``fit``,
``evaluate``, ``train_on_batch`` or ``test_on_batch`` made:

- ``one_device_tape`` (``tf.GradientTape.gradient``, when every source is a
  variable): a target that sums over the batch is differentiated with its
  output gradient multiplied by N, so the average of the replicas' gradients is
  one device's sum; a target that adds a sum to a mean is split into its terms,
  each weighted as one device weighs it (the gradient of ``a + b`` is that of
  ``[a, b]``). A gradient with respect to tensors (a gradient penalty's
  ``tape.gradient(prediction, images)``) is left alone: it is no loss.
- ``one_device_additional_loss`` (``TensorFlowTrainer._aggregate_additional_loss``):
  an ``add_loss`` term that sums over the batch counts N times in
  ``compute_loss``, so that both its gradient and the logged loss are one
  device's; batch means and weight penalties count once.
- ``one_device_compute_loss`` (``TensorFlowTrainer._compute_loss``, which
  Keras's own ``train_step`` and ``test_step`` call): a ``compute_loss`` that
  returns a sum over the batch counts N times, so that the loss Keras logs is
  one device's too. (A per-example vector it returns is logged as its mean,
  one device's already, and weighted at ``tape.gradient``.)

A value a custom ``train_step`` logs itself is not changed: a sum over the
batch it logs by hand is its replica's share, 1/N of one device's (log the
mean, or the sum over `mk.all_gather` of the values).

A loss whose form cannot be read (an op mirrorkit does not know, a nonlinear
function of a batch mean such as a root mean square, a softmax across the
examples of a replica) is averaged, as before, and the chief says once which
one and what to do; `mk.check_equivalence` names it. A term mirrorkit weighted
is said once too.
"""

from __future__ import annotations

import weakref
from typing import Any

import keras
import tensorflow as tf

from mirrorkit.cluster import chief
from mirrorkit.cluster.workers import spans_replicas
from mirrorkit.compat import loss_forms, loss_reader, loss_terms, one_device_loss
from mirrorkit.patching import fit_step
from mirrorkit.patching.repair import Repair

_ACCOUNT = "losses-in-your-own-train_step"
_UPSTREAM = "a loss summed over the batch (docs: compat/#losses-in-your-own-train_step)"

#: What the reads found that mirrorkit could not weight, by model: [(where, form words)].
_UNREAD: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def unread(model: Any) -> list[tuple[str, str]]:
    """The losses of `model`'s steps whose form mirrorkit could not read: (where, form).

    Args:
        model: a Keras model that has trained (or evaluated) across replicas.

    Returns:
        One ``(where, form in words)`` per loss, in the order they were traced.
    """
    return list(dict.fromkeys(_UNREAD.get(model, ())))


def _is_variable(source: Any) -> bool:
    return isinstance(source, (tf.Variable, keras.Variable))


def _where(tensor: Any, reader: loss_reader.Reader | None = None) -> str:
    """Where a loss term comes from, for the notices.

    The op that made `tensor`, as its name scope names it (``vae/add_loss/Sum``), and the op
    the reader could not read past where that is another op.
    """
    where = getattr(getattr(tensor, "op", None), "name", "") or "an eager tensor"
    origin = reader.origin(tensor) if reader is not None else None
    if origin is None or origin.startswith(f"{where} ("):
        return where
    return f"{where}; unreadable from {origin}"


def _said(form: loss_forms.Form, where: str, what: str, replicas: int) -> None:
    if form.kind in ("sum", "batch"):
        chief.say_once(
            f"loss-form-sum-{what}",
            f"{what} ({where}) is {form.describe()}: mirrorkit sums the {replicas} replicas' "
            "gradients of it, as one device's gradient of the sum over the global batch",
        )
    elif not form.weight_known:
        model = fit_step.owner()
        if model is not None:
            _UNREAD.setdefault(model, []).append((f"{what} ({where})", form.describe()))
        chief.say_once(
            f"loss-form-unread-{what}-{form.kind}",
            f"{what} ({where}) is {form.describe()}: mirrorkit averages the {replicas} "
            "replicas' gradients of it, which is one device's gradient only for a mean over "
            "the batch. Write each term as a mean (ops.mean) or a sum (ops.sum) of per-example "
            "values; a nonlinear function of a batch mean (a root mean square) cannot be split "
            "across replicas: compute it on mk.all_gather(...) of the batch. "
            "mk.check_equivalence(model_fn, data) shows whether it trains as one device",
        )


def _weighed(target: Any, output_gradients: Any) -> tuple[list, list] | None:
    """`target` as terms with their weighted output gradients; None if nothing changes."""
    reader = loss_reader.reader()
    replicas = fit_step.replicas()
    targets = tf.nest.flatten(target)
    given = tf.nest.flatten(output_gradients) if output_gradients is not None else None
    new_targets, new_gradients, changed = [], [], False
    for i, tensor in enumerate(targets):
        gradient = given[i] if given is not None else None
        if reader is None or not tensor.dtype.is_floating:
            terms = [(tensor, None, _eager_form(tensor))] if tensor.dtype.is_floating else []
        else:
            terms, _ = loss_terms.weighted_terms(reader, tensor)
            if gradient is not None or any(t.shape != tensor.shape for t, _, _ in terms):
                terms = [(tensor, None, reader.read(tensor))]  # not split: shapes or a gradient
        if not terms:
            new_targets.append(tensor)
            new_gradients.append(gradient)
            continue
        for term, coefficient, form in terms:
            _said(form, _where(term, reader), "a loss given to tape.gradient", replicas)
            weight = form.weight(replicas)
            if weight == 1 and coefficient is None:
                new_targets.append(term)
                new_gradients.append(gradient)
                continue
            changed = True
            scale = tf.cast(weight, term.dtype)
            if coefficient is not None:
                scale = scale * tf.cast(coefficient, term.dtype)
            base = gradient if gradient is not None else tf.ones_like(term)
            new_targets.append(term)
            new_gradients.append(base * scale)
    if not changed:
        return None
    ones = [
        g if g is not None else tf.ones_like(t)
        for t, g in zip(new_targets, new_gradients, strict=True)
    ]
    return new_targets, ones


def _eager_form(tensor: Any) -> loss_forms.Form:
    """A form without a graph to read (``run_eagerly=True``): what the shape tells.

    A vector as long as the batch is per-example values (their sum is differentiated);
    a scalar is taken for a mean, and said as unread.
    """
    if tensor.shape.rank and tensor.shape[0] in fit_step.eager_batch_sizes():
        return loss_forms.Form("batch")
    return loss_forms.Form("unknown") if tensor.shape.rank == 0 else loss_forms.MEAN


def _weighted_gradient(original):
    def gradient(
        self,
        target,
        sources,
        output_gradients=None,
        unconnected_gradients=tf.UnconnectedGradients.NONE,
    ):
        if fit_step.averaging_replicas() > 1 and all(
            _is_variable(s) for s in tf.nest.flatten(sources)
        ):
            weighed = _weighed(target, output_gradients)
            if weighed is not None:
                target, output_gradients = weighed
        return original(self, target, sources, output_gradients, unconnected_gradients)

    gradient.__wrapped__ = original
    gradient.__doc__ = original.__doc__
    return gradient


def _additional_as_one_device(original):
    def _aggregate_additional_loss(self, loss):
        term = original(self, loss)
        if not fit_step.active() or fit_step.replicas() == 1:
            return term
        reader = loss_reader.reader()
        replicas = fit_step.replicas()
        form = reader.read(term) if reader is not None else _eager_form(term)
        _said(form, _where(loss, reader), "an add_loss term", replicas)
        if form.kind in ("sum", "batch"):
            term = term * tf.cast(replicas, term.dtype)
        return loss_forms.mark(term, loss_forms.MEAN)

    _aggregate_additional_loss.__wrapped__ = original
    return _aggregate_additional_loss


def _compute_loss_as_one_device(original):
    def _compute_loss(self, *args, **kwargs):
        loss = original(self, *args, **kwargs)
        if not fit_step.active() or fit_step.replicas() == 1 or not tf.is_tensor(loss):
            return loss
        reader = loss_reader.reader()
        form = reader.read(loss) if reader is not None else None
        if form is None or form.kind not in ("sum", "mixed"):
            return loss
        replicas = fit_step.replicas()
        terms = [(loss, None, form)]
        if form.kind == "mixed":
            terms, _ = loss_terms.weighted_terms(reader, loss)
            if any(not f.weight_known or t.shape != loss.shape for t, _, f in terms):
                return loss  # the tape splits the gradient; it says what it cannot read
        one_device = []
        for term, coefficient, term_form in terms:
            _said(term_form, _where(term, reader), "the loss compute_loss returns", replicas)
            value = term * tf.cast(term_form.weight(replicas), term.dtype)
            if coefficient is not None:
                value = value * tf.cast(coefficient, term.dtype)
            one_device.append(value)
        # The logged loss and its gradient one device's: each sum over the batch N times.
        return loss_forms.mark(tf.add_n(one_device), loss_forms.MEAN)

    _compute_loss.__wrapped__ = original
    return _compute_loss


#: The tests of these repairs (docs: development/#repairs-and-tests is made from them).
TESTS = (
    "tests/test_loss_forms.py::test_summed_losses_train_at_half_the_gradient_upstream",
    "tests/test_loss_forms.py::test_every_loss_form_trains_as_one_device",
    "tests/test_loss_forms.py::test_loss_forms_on_two_workers_train_as_one_device",
    "tests/test_keras_io_examples.py::test_final_weights_as_one_device[dual_encoder]",
)


def _repair(name: str, module: str, target: str, replacement) -> Repair:
    """One repair of this family, with its own case of the loss repairs' canary.

    That canary takes one loss repair off alone (`mirrorkit.compat.one_device_loss.ALONE`).
    """
    return Repair(
        name=name,
        upstream=_UPSTREAM,
        module=module,
        target=target,
        replacement=replacement,
        applies_to=spans_replicas,
        account=_ACCOUNT,
        tests=(f"{one_device_loss.ALONE}[{name}]", *TESTS),
    )


_TRAINER = "keras.src.backend.tensorflow.trainer"

REPAIRS = (
    _repair("one_device_tape", "tensorflow", "GradientTape.gradient", _weighted_gradient),
    _repair(
        "one_device_additional_loss",
        _TRAINER,
        "TensorFlowTrainer._aggregate_additional_loss",
        _additional_as_one_device,
    ),
    _repair(
        "one_device_compute_loss",
        _TRAINER,
        "TensorFlowTrainer._compute_loss",
        _compute_loss_as_one_device,
    ),
)
