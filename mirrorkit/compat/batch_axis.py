"""Where the batch axis of a tensor goes through one op of a traced step, and static values.

Helpers of `mirrorkit.compat.loss_reader`: the constant value of a tensor TensorFlow can
fold (`scalar`, `axes`), an op's attribute (`attr`), a static dimension (`dim`), and where
the examples' axis of an op's input is in its output (`moved_axis`), or None where the op
breaks the examples up (a slice of some of them, a split along them).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf


def scalar(tensor: Any) -> float | None:
    """The value of a constant scalar tensor (or a tensor of one repeated value), else None."""
    try:
        value = tf.get_static_value(tensor)
    except (TypeError, ValueError):  # pragma: no cover - a tensor TF cannot fold
        return None
    if value is None:
        return None
    flat = np.asarray(value).ravel()
    if flat.size == 0 or not np.all(flat == flat[0]):
        return None
    return float(flat[0])


def axes(axes_tensor: Any, source: Any) -> set[int] | None:
    """The axes a reduction reduces (non-negative), or None where they are not constant."""
    value = tf.get_static_value(axes_tensor)
    rank = source.shape.rank
    if value is None or rank is None:
        return None
    return {int(a) % rank if rank else 0 for a in np.asarray(value).ravel()}


def attr(op: Any, name: str) -> Any:
    """The op's attribute `name`, or None where it has none."""
    try:
        return op.get_attr(name)
    except ValueError:
        return None


def dim(tensor: Any, axis: int) -> int | None:
    """The static size of `tensor` along `axis`, or None."""
    shape = tensor.shape
    if shape.rank is None or shape.rank <= axis:
        return None
    return shape[axis]


#: Ops that combine or reorder values along the axes their input at this index names: along
#: the batch axis they pair an example with other examples of this replica only.
_ALONG_AXES = {"Roll": 2, "ReverseV2": 1, "Cumsum": 1, "Cumprod": 1, "CumulativeLogsumexp": 1}
#: Ops that pick or order values along the last axis.
_ALONG_THE_LAST_AXIS = frozenset({"TopKV2", "TopK", "InTopKV2", "InTopK"})


def moved_axis(op: Any, axis: int, tensor: Any) -> int | None:
    """Where the batch `axis` of `op`'s data input is in `tensor`, or None if it is broken up."""
    kind = op.type
    rank = op.inputs[0].shape.rank if op.inputs else None
    if kind in _ALONG_AXES:
        along = tf.get_static_value(op.inputs[_ALONG_AXES[kind]])
        if along is None or rank is None:
            return None
        return None if axis in {int(a) % rank for a in np.asarray(along).ravel()} else axis
    if kind in _ALONG_THE_LAST_AXIS:
        return None if rank is None or axis == rank - 1 else axis
    if kind == "Transpose":
        perm = tf.get_static_value(op.inputs[1])
        return None if perm is None else [int(p) for p in perm].index(axis)
    if kind == "ExpandDims":
        inserted = scalar(op.inputs[1])
        rank = tensor.shape.rank
        if inserted is None or rank is None:
            return None
        return axis + 1 if int(inserted) % rank <= axis else axis
    if kind in ("Pack",):
        stack_axis = attr(op, "axis") or 0
        rank = tensor.shape.rank
        if rank is None:
            return None
        return axis + 1 if stack_axis % rank <= axis else axis
    if kind in ("ConcatV2", "Concat"):
        return axis
    if kind in ("Unpack", "Split", "SplitV"):
        split = (
            attr(op, "axis")
            if kind == "Unpack"
            else scalar(op.inputs[0] if kind == "Split" else op.inputs[2])
        )
        if split is None or int(split) == axis:
            return None
        return axis - 1 if kind == "Unpack" and int(split) < axis else axis
    if kind == "StridedSlice":
        return _strided_axis(op, axis)
    # Everything else (Reshape, Tile, Pad, BroadcastTo, Conv2D, pooling, batch norm,
    # function calls, ...): the examples stay along axis 0 when the output keeps that
    # dimension's size.
    if axis != 0 or tensor.shape.rank in (None, 0):
        return None
    source = op.inputs[0]
    inner, outer = dim(source, 0), dim(tensor, 0)
    return 0 if inner == outer else None


def _strided_axis(op: Any, axis: int) -> int | None:
    """Where ``x[...]`` (a ``StridedSlice``) puts the batch `axis`: kept whole, or None."""
    begin, end = attr(op, "begin_mask") or 0, attr(op, "end_mask") or 0
    ellipsis, new_axis = attr(op, "ellipsis_mask") or 0, attr(op, "new_axis_mask") or 0
    shrink = attr(op, "shrink_axis_mask") or 0
    if new_axis:
        return None
    if ellipsis:  # x[..., i]: the leading axes are kept whole
        return axis if ellipsis & 1 and axis == 0 else None
    starts, ends, strides = (tf.get_static_value(t) for t in op.inputs[1:4])
    if starts is None or ends is None or strides is None:
        return None
    if len(starts) > axis:  # the slice names the batch axis: it must take all of it
        whole_start = begin >> axis & 1 or int(starts[axis]) == 0
        whole_end = end >> axis & 1 or ends[axis] >= (dim(op.inputs[0], axis) or 2**62)
        if shrink >> axis & 1 or not (whole_start and whole_end) or int(strides[axis]) != 1:
            return None
    return axis - sum(1 for a in range(axis) if shrink >> a & 1)
