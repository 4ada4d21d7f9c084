"""Where the examples go through a product of tensors (a helper of `loss_reader`).

`matmul` reads a ``MatMul`` or ``BatchMatMul``: rows of a batch times a constant keep one
row per example; a batch's transpose times a batch is a sum over the examples; this
replica's examples against its own (a similarity matrix of the local batch, without
`mk.all_gather`) pair examples that one device would pair with the whole global batch,
and are not readable. `einsum` reads an ``Einsum`` by its equation the same way.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mirrorkit.compat import batch_axis
from mirrorkit.compat.loss_forms import UNKNOWN, Form, elementwise


def matmul(op: Any, inputs: list[Form]) -> Form:
    """The form of a ``MatMul``/``BatchMatMul``: where the examples go through a product."""
    a, b = inputs
    if {a.kind, b.kind} <= {"const", "mean"}:
        return elementwise(inputs)
    rank = op.inputs[0].shape.rank
    if rank != 2 or op.inputs[1].shape.rank != 2:  # batched matmul: rows of each example
        return a if a.kind == "batch" and a.axis == 0 else UNKNOWN
    transpose_a = bool(batch_axis.attr(op, "transpose_a") or batch_axis.attr(op, "adj_x"))
    transpose_b = bool(batch_axis.attr(op, "transpose_b") or batch_axis.attr(op, "adj_y"))
    rows_a, inner_a = (1, 0) if transpose_a else (0, 1)
    inner_b, columns_b = (1, 0) if transpose_b else (0, 1)
    batch_a = a.kind in ("batch", "gathered")
    batch_b = b.kind in ("batch", "gathered")
    if batch_a and a.axis == inner_a and batch_b and b.axis == inner_b:
        return Form("sum", 0, a.size, None)  # x^T y: a sum over the examples
    if a.kind == "batch" and a.axis == rows_a and b.kind == "batch" and b.axis == columns_b:
        # this replica's examples against its own (in-batch negatives without
        # mk.all_gather): one device pairs each example with the whole global batch
        return UNKNOWN
    if batch_a and a.axis == rows_a and b.kind != "unknown" and not (batch_b and b.axis == inner_b):
        return dataclasses.replace(a, axis=0)  # one row per example (of this replica)
    if not batch_a and a.kind == "const" and batch_b and b.axis == columns_b:
        return dataclasses.replace(b, axis=1)  # one column per example
    return UNKNOWN


def einsum(op: Any, inputs: list[Form]) -> Form:
    """The form of an ``Einsum`` (``ops.einsum`` that is not a plain matrix product).

    Each input's examples run along one letter of the equation. One letter for every input
    that holds examples: kept in the output, one value per example there; summed away, a
    sum over the examples. This replica's examples along two letters pair them with each
    other only: not readable. A local batch's letter beside a gathered batch's keeps the
    local rows (each example against the global batch).
    """
    equation = batch_axis.attr(op, "equation")
    equation = equation.decode() if isinstance(equation, bytes) else equation
    carriers = [f for f in inputs if f.kind in ("batch", "gathered")]
    if not carriers:
        return elementwise(inputs)
    if not equation or "..." in equation or "->" not in equation:
        return UNKNOWN
    terms, out = equation.split("->")
    terms = terms.split(",")
    if len(terms) != len(inputs) or any(f.kind in ("unknown", "sum", "mixed") for f in inputs):
        return UNKNOWN
    letters = {}
    for form, term in zip(inputs, terms, strict=True):
        if form.kind in ("batch", "gathered"):
            if form.axis >= len(term):
                return UNKNOWN
            letters.setdefault(form.kind, set()).add(term[form.axis])
    local = letters.get("batch", set())
    if len(local) > 1:
        return UNKNOWN  # this replica's examples against its own
    first = next(f for f in carriers if f.kind == "batch") if local else carriers[0]
    (letter,) = local or letters["gathered"]
    if letter in out:
        return dataclasses.replace(first, axis=out.index(letter))
    if len(carriers) == 2 and not (local and letters.get("gathered")):
        return Form("sum", 0, first.size, None)  # x^T y: a sum over the examples
    return UNKNOWN
