"""A loss that adds a sum over the batch to a mean, split into terms of one form each.

The gradient of ``a + b`` is the gradient of ``[a, b]``: `weighted_terms` splits a loss
whose `mirrorkit.compat.loss_forms.Form` is ``"mixed"`` where it is added up (``+``,
``-``, ``AddN``, ``ops.sum`` of a list, a constant factor), each term with its coefficient
and its own form, so that `mirrorkit.compat.one_device_tape` can weight each as one device
weighs it (a sum N times, a mean once).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from mirrorkit.compat import batch_axis
from mirrorkit.compat.loss_forms import Form
from mirrorkit.compat.loss_reader import Reader

#: Ops that multiply: a constant factor is a coefficient of the term it multiplies.
_MUL = frozenset({"Mul", "MulNoNan"})


def weighted_terms(reader: Reader, target: Any) -> tuple[list[tuple[Any, Any, Form]], Form]:
    """`target` as terms to differentiate, each with its coefficient and form.

    A target of one form is one term with coefficient 1. A ``"mixed"`` target
    (a sum over the batch plus a mean) is split where it is added up (``+``,
    ``-``, ``AddN``, ``ops.sum`` of a list, a constant factor), so that each
    term can be weighted on its own: the gradient of ``a + b`` is the
    gradient of ``[a, b]``.

    Args:
        reader: the step's `Reader`.
        target: a tensor handed to ``tape.gradient``.

    Returns:
        ``(terms, form)``: the terms as ``(tensor, coefficient or None, form)``,
        and the target's own form.
    """
    form = reader.read(target)
    if form.kind != "mixed":
        return [(target, None, form)], form
    terms: list[tuple[Any, Any, Form]] = []
    stack = [(target, None, form)]
    while stack:
        tensor, coefficient, tensor_form = stack.pop()
        parts = _split(reader, tensor, coefficient) if tensor_form.kind == "mixed" else None
        if parts is None:
            terms.append((tensor, coefficient, tensor_form))
        else:
            stack.extend(parts)
    return terms, form


def _split(reader: Reader, tensor: Any, coefficient: Any):
    op = tensor.op
    kind = op.type

    def times(factor):
        if coefficient is None:
            return factor
        return (
            coefficient * tf.cast(factor, coefficient.dtype)
            if tf.is_tensor(factor)
            else coefficient * factor
        )

    def part(t, factor=None, divisor=None):
        c = coefficient if factor is None else times(factor)
        form = reader.read(t)
        if divisor is not None and form.kind == "sum":
            form = reader.scaled_sum(form, divisor)
        return (t, c, form)

    if kind in ("AddV2", "Add", "AddN"):
        return [part(t) for t in op.inputs]
    if kind == "Sub":
        return [part(op.inputs[0]), part(op.inputs[1], -1.0)]
    if kind == "Neg":
        return [part(op.inputs[0], -1.0)]
    if kind in ("Identity", "Cast"):
        return [part(op.inputs[0])]
    if kind == "Sum" and op.inputs[0].op.type == "Pack":
        return [part(t) for t in op.inputs[0].op.inputs]
    if kind in _MUL:
        for i in (0, 1):
            other = op.inputs[1 - i]
            if reader.read(other).kind == "const" and other.shape.rank == 0:
                value = batch_axis.scalar(other)
                return [part(op.inputs[i], other, 1.0 / value if value else None)]
    if kind in ("RealDiv", "Div") and reader.read(op.inputs[1]).kind == "const":
        value = batch_axis.scalar(op.inputs[1])
        if value:
            return [part(op.inputs[0], 1.0 / value, value)]
    return None
