"""How a loss depends on the batch, read from the traced step: a mean, a sum, or neither.

One device's gradient of a loss over the global batch is what N replicas must
give. How the replicas' gradients combine into it depends on the loss's form:

- a mean over the batch (``ops.mean``, a ``keras.losses`` object, a loss with
  ``reduction="sum"`` that mirrorkit already makes one device's, a batch mean
  added with ``add_loss``), or a weight penalty that does not depend on the
  batch at all: one device's gradient is the replicas' average;
- a sum over the batch (``ops.sum`` over the examples, a per-example loss
  vector handed to ``tape.gradient``, which differentiates its sum, an
  ``add_loss`` of a sum over the examples): one device's gradient is the
  replicas' sum.

Inside ``fit`` mirrorkit averages the replicas' gradients
(`mirrorkit.compat.one_device_loss`), so a sum must weigh N times. This module
is the vocabulary: `Form`, the algebra of forms (`added`, `elementwise`,
`nonlinear`) and the marks mirrorkit puts on tensors it made itself (`mark`);
`mirrorkit.compat.loss_reader` reads the form of a tensor of the traced step
with them. A form mirrorkit cannot read (an op it does not know on the way, a
nonlinear function of a batch mean, a softmax across the batch) is
``"unknown"`` or ``"nonlinear"``: the step then averages, as before, and the
chief is told once which loss and what to do.

The kinds of `Form`:

- ``"const"``: no dependence on the batch (weights, constants, random draws, labels);
- ``"batch"``: one value per example, along `Form.axis`;
- ``"gathered"``: every replica's examples (`mk.all_gather`), along `Form.axis`;
- ``"mean"``: an average over the examples (or a value the replicas share);
- ``"sum"``: a sum over the examples (grows with the batch);
- ``"size"`` / ``"shape"``: the batch size (or a shape that holds it), known only at run time;
- ``"mixed"``: a sum plus a mean or a constant;
- ``"nonlinear"``: a nonlinear function of a mean or a sum;
- ``"unknown"``: made by ops this module does not read.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any

import tensorflow as tf

#: Marks mirrorkit puts on tensors it made itself: graph -> {tensor name: Form}.
_MARKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclasses.dataclass(frozen=True)
class Form:
    """How a tensor depends on the replica's batch.

    Attributes:
        kind: one of the kinds listed in the module's docstring.
        axis: the batch axis (``"batch"``, ``"gathered"``, ``"shape"``).
        size: the replica's batch size where it is known statically.
        per_example: for ``"sum"``, how many values of each example were summed, where known.
    """

    kind: str
    axis: int = 0
    size: int | None = None
    per_example: int | None = None

    @property
    def weight_known(self) -> bool:
        """Whether one device's gradient is a known multiple of the replicas' average."""
        return self.kind in ("const", "mean", "sum", "batch", "gathered")

    def weight(self, replicas: int) -> int:
        """What the averaged gradient of a tensor of this form is multiplied by: 1 or N."""
        return replicas if self.kind in ("sum", "batch") else 1

    def describe(self) -> str:
        """The form in words, for the notices."""
        return _WORDS.get(self.kind, self.kind)


_WORDS = {
    "const": "independent of the batch",
    "mean": "a mean over the batch",
    "sum": "a sum over the batch",
    "batch": "one value per example (its gradient is that of their sum)",
    "gathered": "computed on every replica's examples",
    "mixed": "a sum over the batch added to a mean or a constant",
    "nonlinear": "a nonlinear function of a batch mean or sum",
    "unknown": "made by operations mirrorkit cannot read",
    "size": "the batch size",
    "shape": "a shape",
}

CONST, MEAN, UNKNOWN, NONLINEAR, MIXED = (
    Form("const"),
    Form("mean"),
    Form("unknown"),
    Form("nonlinear"),
    Form("mixed"),
)


def mark(tensor: Any, form: Form) -> Any:
    """Records that mirrorkit made `tensor` with `form` (e.g. a loss already one device's).

    Args:
        tensor: a graph tensor of the traced step (eager tensors are not marked).
        form: its form.

    Returns:
        `tensor`, for ``return mark(loss, MEAN)``.
    """
    graph = getattr(tensor, "graph", None)
    if graph is not None and not tf.executing_eagerly() and hasattr(tensor, "op"):
        _MARKS.setdefault(graph, {})[tensor.name] = form
    return tensor


def marks_in(graph: Any) -> dict[str, Form]:
    """The tensors of `graph` mirrorkit marked (`mark`), by name."""
    return dict(_MARKS.get(graph, {}))


# -- the algebra ---------------------------------------------------------------------


def nonlinear(form: Form) -> Form:
    """A nonlinear function of one value of `form`, applied value by value."""
    if form.kind in ("const", "batch", "gathered", "unknown"):
        return form
    return NONLINEAR


def added(inputs: list[Form]) -> Form:
    """The form of a sum of values of these forms (``+``, ``-``, ``AddN``)."""
    batch = [f for f in inputs if f.kind in ("batch", "gathered")]
    if batch:
        return elementwise(inputs)
    kinds = {f.kind for f in inputs}
    if kinds <= {"const"}:
        return CONST
    if kinds <= {"const", "mean"}:
        return MEAN
    if kinds == {"sum"}:
        sizes = {f.size for f in inputs}
        per_example = {f.per_example for f in inputs}
        return Form(
            "sum",
            0,
            sizes.pop() if len(sizes) == 1 else None,
            per_example.pop() if len(per_example) == 1 else None,
        )
    if "unknown" in kinds:
        return UNKNOWN
    if "nonlinear" in kinds:
        return NONLINEAR
    if kinds <= {"size", "const"}:
        return NONLINEAR
    return MIXED


def elementwise(inputs: list[Form]) -> Form:
    """The form of an elementwise function (not a sum) of values of these forms."""
    batch = [f for f in inputs if f.kind in ("batch", "gathered")]
    if any(f.kind == "unknown" for f in inputs):
        return UNKNOWN
    if batch:
        first = batch[0]
        if any(f.kind != first.kind or f.axis != first.axis for f in batch):
            return UNKNOWN
        return first
    kinds = {f.kind for f in inputs}
    return CONST if kinds <= {"const"} else NONLINEAR
