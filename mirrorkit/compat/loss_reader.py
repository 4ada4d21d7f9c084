"""The form of a loss, read from the ops of the traced step that made it.

`Reader` walks back from a tensor of a replica's traced ``fit`` step to the
replica's batch (the step's ``data``, `mirrorkit.patching.fit_step`) and gives
its `mirrorkit.compat.loss_forms.Form`: a mean over the batch, a sum, one value
per example, or neither (`mirrorkit.compat.loss_terms` splits a loss that adds
a sum to a mean into its terms).
Ops this module does not know keep the examples along axis 0 when their output
keeps that dimension's size; anything else is ``"unknown"``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import tensorflow as tf

from mirrorkit.compat import batch_axis, loss_products
from mirrorkit.compat.loss_forms import (
    CONST,
    MEAN,
    MIXED,
    NONLINEAR,
    UNKNOWN,
    Form,
    added,
    elementwise,
    marks_in,
    nonlinear,
)
from mirrorkit.patching import fit_step

# -- op tables ----------------------------------------------------------------------

_LINEAR_UNARY = frozenset({"Identity", "Cast", "Neg", "Snapshot", "EnsureShape", "CheckNumerics",
                           "PreventGradient", "StopGradient", "Real", "DebugIdentityV2",
                           "Bitcast"})  # fmt: skip
#: Ops whose values do not depend on the examples (a shape is read on its own).
_INDEPENDENT = frozenset({"ZerosLike", "OnesLike", "Fill", "Range", "Shape", "ShapeN", "Rank",
                          "RandomUniform", "RandomStandardNormal", "TruncatedNormal",
                          "StatelessRandomUniformV2", "StatelessRandomNormalV2",
                          "StatelessTruncatedNormalV2", "StatelessRandomUniformIntV2",
                          "StatelessRandomGetKeyCounter", "RandomUniformInt", "Multinomial",
                          "StatelessMultinomial"})  # fmt: skip
_NONLINEAR_UNARY = frozenset({"Square", "Sqrt", "Rsqrt", "Exp", "Expm1", "Log", "Log1p", "Relu",
                              "Relu6", "Elu", "Selu", "Sigmoid", "Tanh", "Softplus", "Softsign",
                              "Abs", "Reciprocal", "Inv", "Sin", "Cos", "Tan", "Erf", "Erfc",
                              "LeakyRelu", "Gelu", "Atan", "Asinh", "Acosh", "Atanh",
                              "Sinh", "Cosh", "Lgamma", "Digamma", "Floor", "Ceil", "Round",
                              "Sign", "IsFinite", "IsNan", "IsInf", "LogicalNot"})  # fmt: skip
_ADD = frozenset({"AddV2", "Add", "Sub", "AddN", "BiasAdd"})
_MUL = frozenset({"Mul", "MulNoNan"})
_DIV = frozenset({"RealDiv", "Div", "DivNoNan", "TruncateDiv", "FloorDiv"})
_OTHER_BINARY = frozenset({"Maximum", "Minimum", "Pow", "SquaredDifference", "FloorMod",
                           "Xdivy", "Xlogy", "Xlog1py", "Atan2", "SelectV2", "Select",
                           "Equal", "NotEqual", "Greater", "GreaterEqual", "Less", "LessEqual",
                           "LogicalAnd", "LogicalOr"})  # fmt: skip
_REDUCE = frozenset({"Sum", "Mean", "Max", "Min", "Prod", "EuclideanNorm", "All", "Any"})
_SOFTMAX = frozenset({"Softmax", "LogSoftmax"})
_MATMUL = frozenset({"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"})


class Reader:
    """Reads the `Form` of tensors of one traced step (memoised per reader).

    Args:
        graph: the graph of the step (the tensors' graph).
        batch: the names of the replica's batch tensors in that graph.
    """

    def __init__(self, graph: Any, batch: set[str]):
        self._marks = marks_in(graph)
        self._batch = set(batch)
        self._memo: dict[str, Form] = {}
        self._origin: dict[str, str] = {}  # an unknown tensor -> the op it became unknown at

    def read(self, tensor: Any) -> Form:
        """The form of `tensor` (a graph tensor)."""
        stack = [tensor]
        while stack:  # iterative: a deep model's graph is deeper than Python's recursion
            current = stack[-1]
            if current.name in self._memo:
                stack.pop()
                continue
            pending = [t for t in self._inputs_needed(current) if t.name not in self._memo]
            if pending:
                stack.extend(pending)
                continue
            stack.pop()
            form = self._memo[current.name] = self._form_of(current)
            if form.kind == "unknown":
                self._origin[current.name] = next(
                    (self._origin[t.name] for t in self._inputs_needed(current)
                     if t.name in self._origin),
                    f"{current.op.name} ({current.op.type})",
                )  # fmt: skip
        return self._memo[tensor.name]

    def origin(self, tensor: Any) -> str | None:
        """The op (``name (Type)``) where a tensor read as unknown became unknown, or None."""
        self.read(tensor)
        return self._origin.get(tensor.name)

    def _inputs_needed(self, tensor: Any) -> list[Any]:
        if tensor.name in self._marks or tensor.name in self._batch:
            return []
        return list(tensor.op.inputs)

    # -- one op -------------------------------------------------------------

    def _form_of(self, tensor: Any) -> Form:
        if tensor.name in self._marks:
            return self._marks[tensor.name]
        if tensor.name in self._batch:
            return Form("batch", 0, batch_axis.dim(tensor, 0))
        op = tensor.op
        kind = op.type
        inputs = [self._memo[t.name] for t in op.inputs]
        if not op.inputs or kind in ("ReadVariableOp", "VarHandleOp", "ResourceGather"):
            return CONST if kind != "ResourceGather" else self._gather(op, CONST, inputs)
        if kind in _INDEPENDENT:
            return self._independent(op, inputs)
        if inputs[0].kind == "shape" and kind in ("StridedSlice", "Slice", "GatherV2", "Gather"):
            return self._size_in(op, inputs[0])
        if kind == "Size":
            return Form("size") if inputs[0].kind in ("batch", "gathered") else CONST
        if kind in _LINEAR_UNARY:
            return inputs[0]
        if kind == "IdentityN":
            return inputs[tensor.value_index]
        if kind in _NONLINEAR_UNARY:
            return nonlinear(inputs[0])
        if kind in _ADD:
            return added(inputs)
        if kind in _MUL:
            return self._multiplied(op, inputs)
        if kind in _DIV:
            return self._divided(op, inputs)
        if kind in _OTHER_BINARY:
            picked = inputs[1:] if kind in ("SelectV2", "Select") else inputs
            return elementwise(picked)
        if kind in _REDUCE:
            return self._reduced(op, inputs)
        if kind in _SOFTMAX:
            return self._softmax(op, inputs)
        if kind in _MATMUL:
            return loss_products.matmul(op, inputs)
        if kind == "Einsum":
            return loss_products.einsum(op, inputs)
        return self._structural(op, tensor, inputs)

    def _independent(self, op: Any, inputs: list[Form]) -> Form:
        """Values that do not depend on the examples, but may be one per example.

        ``ops.ones_like(y)`` of a batch, and a tensor filled or drawn to a shape read from
        the batch (``tf.random.normal(tf.shape(x))``), hold one value per example: summed
        over the batch they count the examples, as a mean's divisor does.
        """
        source = inputs[0] if inputs else CONST
        if op.type in ("Shape", "ShapeN"):
            return Form("shape", source.axis) if source.kind in ("batch", "gathered") else CONST
        if op.type in ("ZerosLike", "OnesLike") and source.kind in ("batch", "gathered"):
            return source
        if source.kind == "shape" and source.axis >= 0:
            return Form("batch", source.axis)
        return CONST

    def _size_in(self, op: Any, shape: Form) -> Form:
        """``ops.shape(x)[i]``: the batch size where ``i`` is the batch axis, else a constant.

        A part of a shape (``shape[1:]``) is a shape, with the batch axis where it went.
        """
        start = batch_axis.scalar(op.inputs[1])
        shrink = op.type == "StridedSlice" and (batch_axis.attr(op, "shrink_axis_mask") or 0) & 1
        if op.type in ("GatherV2", "Gather") or shrink:
            if start is None:
                return UNKNOWN
            return Form("size") if int(start) == shape.axis else CONST
        if start is None or (op.type == "StridedSlice" and batch_axis.attr(op, "begin_mask")):
            return Form("shape", -1)  # the batch axis's place unknown: a shape all the same
        return Form("shape", shape.axis - int(start))

    def _multiplied(self, op: Any, inputs: list[Form]) -> Form:
        a, b = inputs
        if "batch" in (a.kind, b.kind) or "gathered" in (a.kind, b.kind):
            return elementwise(inputs)
        for this, other, tensor in ((a, b, op.inputs[1]), (b, a, op.inputs[0])):
            if other.kind == "const":
                value = batch_axis.scalar(tensor)
                if this.kind == "sum" and value:
                    return self.scaled_sum(this, 1.0 / value)
                return this
        kinds = {a.kind, b.kind}
        if kinds == {"size", "mean"}:
            return Form("sum")
        if kinds <= {"size", "const"}:
            return Form("size")
        return UNKNOWN if "unknown" in kinds else NONLINEAR

    def _divided(self, op: Any, inputs: list[Form]) -> Form:
        top, bottom = inputs
        if top.kind in ("batch", "gathered") and bottom.kind in ("const", "mean", "size"):
            return top
        if bottom.kind == "const":
            value = batch_axis.scalar(op.inputs[1])
            if value is None:
                value = _count_of(op.inputs[1])
            if top.kind == "sum":
                return self.scaled_sum(top, value)
            if top.kind == "mean" and value is not None and value == top.size and value != 1:
                return NONLINEAR  # a mean divided by the batch size again
            return top
        if bottom.kind == "size":
            if top.kind == "sum":
                return MEAN
            if top.kind == "size":
                return CONST
        if "batch" in (top.kind, bottom.kind):
            return elementwise(inputs)
        return UNKNOWN if "unknown" in (top.kind, bottom.kind) else NONLINEAR

    def scaled_sum(self, form: Form, divisor: float | None) -> Form:
        """A sum divided by the constant `divisor`: a mean where it is the batch size."""
        if not divisor or form.size is None:
            return form
        per_batch = divisor / form.size
        if math.isclose(per_batch, 1.0):
            return MEAN  # ops.sum(x) / ops.shape(x)[0]: the shape is static, a constant
        if form.per_example and math.isclose(per_batch, float(form.per_example)):
            return MEAN  # the sum of every value, divided by their count (ops.mean's own)
        return form  # a weighted sum (1/the global batch: TensorFlow's custom-loop recipe)

    def _reduced(self, op: Any, inputs: list[Form]) -> Form:
        source = inputs[0]
        axes = batch_axis.axes(op.inputs[1], op.inputs[0])
        if source.kind in ("batch", "gathered"):
            if axes is None:
                return UNKNOWN
            if source.axis not in axes:
                keep = op.get_attr("keep_dims")
                shift = 0 if keep else sum(1 for a in axes if a < source.axis)
                return dataclasses.replace(source, axis=source.axis - shift)
            if source.kind == "gathered":  # the same value on every replica
                return MEAN if op.type in ("Sum", "Mean") else NONLINEAR
            if op.type == "Mean":
                return MEAN
            if op.type == "Sum" and _counts(op.inputs[0]):
                return Form("size")  # ops.sum(ops.ones_like(y)): the number of examples
            if op.type == "Sum":
                dims = op.inputs[0].shape
                per_example = 1
                for a in axes:
                    if a == source.axis:
                        continue
                    if dims.rank is None or dims[a] is None:
                        per_example = None
                        break
                    per_example *= int(dims[a])
                return Form("sum", 0, source.size, per_example)
            return NONLINEAR
        if source.kind in ("const", "mean", "sum", "mixed", "unknown", "nonlinear"):
            return source if op.type in ("Sum", "Mean") else nonlinear(source)
        if source.kind == "shape" and op.type == "Prod":
            return Form("size")
        return CONST if source.kind == "shape" else UNKNOWN

    def _softmax(self, op: Any, inputs: list[Form]) -> Form:
        source = inputs[0]
        rank = op.inputs[0].shape.rank
        if source.kind in ("batch", "gathered") and rank is not None and source.axis == rank - 1:
            return UNKNOWN  # a softmax across the examples of this replica only
        return nonlinear(source) if source.kind not in ("batch", "gathered") else source

    def _gather(self, op: Any, params: Form, inputs: list[Form]) -> Form:
        indices = inputs[1] if len(inputs) > 1 else CONST
        if indices.kind == "batch":
            return Form("batch", indices.axis, indices.size)
        return params

    def _structural(self, op: Any, tensor: Any, inputs: list[Form]) -> Form:
        """Ops that move, pick or copy values: the batch axis followed where it can be."""
        kind = op.type
        data = [f for f in inputs if f.kind not in ("shape", "size")]
        if all(f.kind == "const" for f in data):
            return CONST
        if kind in ("GatherV2", "Gather"):
            return self._gathered_values(op, inputs)
        batch = [f for f in data if f.kind in ("batch", "gathered")]
        if not batch:  # mean, sum, ... moved around, not computed on
            kinds = {f.kind for f in data}
            if kinds <= {"const", "mean"}:
                return MEAN
            if kinds == {"sum"} and kind in ("Pack", "ConcatV2", "Reshape", "ExpandDims",
                                             "Squeeze", "StridedSlice", "Slice"):  # fmt: skip
                return Form("sum")
            return UNKNOWN if "unknown" in kinds else MIXED if "sum" in kinds else NONLINEAR
        first = batch[0]
        if any(f.kind != first.kind or f.axis != first.axis for f in batch):
            return self._rows_of(op, tensor, inputs)
        axis = batch_axis.moved_axis(op, first.axis, tensor)
        if axis is None:
            return UNKNOWN
        return dataclasses.replace(first, axis=axis)

    def _rows_of(self, op: Any, tensor: Any, inputs: list[Form]) -> Form:
        """The rows of an op whose inputs hold examples along different axes.

        A crossentropy of this replica's logits against targets taken from the gathered
        batch: the output's rows are the first input's whose examples run along its axis 0
        and keep their count.
        """
        for form, source in zip(inputs, op.inputs, strict=True):
            if form.kind in ("batch", "gathered") and form.axis == 0:
                kept = tensor.shape.rank and batch_axis.dim(source, 0) == batch_axis.dim(tensor, 0)
                return form if kept and batch_axis.dim(tensor, 0) is not None else UNKNOWN
        return UNKNOWN

    def _gathered_values(self, op: Any, inputs: list[Form]) -> Form:
        params, indices = inputs[0], inputs[1]
        axis = batch_axis.scalar(op.inputs[2]) if len(op.inputs) > 2 else 0
        if indices.kind == "batch" and params.kind == "const":
            return Form("batch", indices.axis + int(axis or 0), indices.size)
        if params.kind == "gathered" and indices.kind == "const" and axis is not None:
            # rows of the gathered batch (this replica's, by mk.all_gather_offset), along any
            # axis that holds every replica's examples (a similarity matrix has two): one
            # value per example of this replica
            return Form("batch", int(axis))
        if params.kind == "batch" and indices.kind == "const" and axis is not None:
            if int(axis) == params.axis:
                return UNKNOWN  # examples picked out of this replica's own batch
            if int(axis) < params.axis:
                rank = op.inputs[1].shape.rank
                return (
                    UNKNOWN
                    if rank is None
                    else dataclasses.replace(params, axis=params.axis - 1 + rank)
                )
            return params
        return UNKNOWN


def _counts(tensor: Any) -> bool:
    """Whether `tensor` is ones (``ops.ones_like``, or filled with 1): its sum is a count."""
    op = tensor.op
    while op.type in _LINEAR_UNARY and op.type != "Neg" and op.inputs:
        op = op.inputs[0].op
    if op.type == "OnesLike":
        return True
    if op.type == "Const":  # ones_like of a static shape is folded into a constant
        return batch_axis.scalar(op.outputs[0]) == 1.0
    return op.type == "Fill" and batch_axis.scalar(op.inputs[1]) == 1.0


def _count_of(tensor: Any) -> float | None:
    """The static count ``ops.sum(ops.ones_like(y))`` gives where ``y``'s shape is static."""
    op = tensor.op
    while op.type in _LINEAR_UNARY and op.type != "Neg" and op.inputs:
        op = op.inputs[0].op
    if op.type != "Sum" or not _counts(op.inputs[0]):
        return None
    shape, axes = op.inputs[0].shape, batch_axis.axes(op.inputs[1], op.inputs[0])
    if axes is None or not shape.is_fully_defined():
        return None
    return float(math.prod(int(shape[a]) for a in axes))


def reader() -> Reader | None:
    """A reader for the step being traced now, or None outside a traced ``fit`` step."""
    if tf.executing_eagerly():
        return None
    graph = tf.compat.v1.get_default_graph()
    return Reader(graph, fit_step.batch_tensors(graph))
