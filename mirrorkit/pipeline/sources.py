"""Turn what users pass as data into one unbatched tf.data pipeline, with its size."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from mirrorkit.cluster import chief
from mirrorkit.pipeline import batched


@dataclasses.dataclass
class Source:
    """An unbatched pipeline, how to read it, and what is known of it.

    Attributes:
        dataset: unbatched elements in input order (None for index sources
            before `read` is applied).
        num_examples: how many elements, when known.
        read: for in-memory arrays, maps a batch of indices to a batch of
            elements (so shuffling moves indices, not data); None otherwise.
    """

    dataset: tf.data.Dataset
    num_examples: int | None
    read: Callable[[tf.Tensor], Any] | None = None


def is_array_data(data: Any) -> bool:
    """Whether `data` is NumPy/tensor arrays: x, a dict of them, or an (x, y[, w]) tuple."""
    if isinstance(data, (np.ndarray, tf.Tensor, tf.RaggedTensor, tf.SparseTensor)):
        return True
    if isinstance(data, Mapping):
        return bool(data) and all(is_array_data(v) for v in data.values())
    if isinstance(data, tuple) and 1 <= len(data) <= 3:
        return all(v is None or is_array_data(v) for v in data)
    return False


def from_arrays(data: Any) -> Source:
    """An index source over in-memory arrays: ``x``, a dict, or ``(x, y[, sample_weight])``.

    Raises:
        ValueError: the arrays do not all have the same number of rows.
    """
    if isinstance(data, tuple):
        data = tuple(v for v in data if v is not None)
    tensors = tf.nest.map_structure(_to_tensor, data)
    lengths = {int(_rows(t)) for t in tf.nest.flatten(tensors)}
    if len(lengths) != 1:
        raise ValueError(
            f"The arrays in data have different numbers of rows ({sorted(lengths)}); x, y and "
            "sample_weight need one row per example."
        )
    (count,) = lengths

    def read(indices: tf.Tensor) -> Any:
        return tf.nest.map_structure(lambda t: t.gather(indices), rows)

    rows = tf.nest.map_structure(_Rows.of, tensors)

    return Source(tf.data.Dataset.range(count), count, read)


def from_dataset(
    dataset: tf.data.Dataset, global_batch_size: int, found: batched.Batching | None
) -> Source:
    """A source of single examples from a tf.data pipeline; an already-batched one is unbatched.

    Args:
        dataset: the user's pipeline.
        global_batch_size: the global batch it will be batched into again.
        found: how `dataset` is batched (`mirrorkit.pipeline.batched.find`), or None.

    Returns:
        The unbatched pipeline with its example count, which an unbatched
        batch pipeline keeps (``assert_cardinality``) whenever the batches'
        count is known, so Keras still sees the epoch's length.

    Raises:
        ValueError: the pipeline ends in ``padded_batch``, whose padding would
            become examples if unbatched.
    """
    if found is not None:
        if found.padded:
            raise ValueError(
                f"data is already batched with padded_batch (batch size {found.batch_size}); "
                "unbatching would turn its padding into examples. Pass "
                f"global_batch_size={found.batch_size} (or neither batch size) to keep its "
                "batches as they are, or pass the dataset as it is before padded_batch."
            )
        chief.say_once(
            "rebatched",
            f"data was already batched (batch size {found.batch_size}); mk.distribute "
            f"unbatched it and batches it again with global batch size {global_batch_size} "
            "(pass neither batch size to keep its own batches)",
        )
        dataset = dataset.unbatch()
        if found.num_examples is not None:
            dataset = dataset.apply(tf.data.experimental.assert_cardinality(found.num_examples))
    elif _may_be_batches(dataset.element_spec):
        chief.say_once(
            "maybe-batched",
            "mk.distribute cannot tell whether data is already batched (every part of its "
            "elements has an unknown leading dimension, as batches have, and the pipeline "
            "hides how it was made: from_generator, flat_map, interleave, ...). It treats each "
            "element as one example; if each element is a batch, call .unbatch() on the "
            "dataset first.",
        )
    count = int(dataset.cardinality())
    return Source(dataset, count if count >= 0 else None)


def _may_be_batches(spec: Any) -> bool:
    """Whether every tensor of an element has an unknown leading dimension, as batches have."""
    parts = tf.nest.flatten(spec)
    return bool(parts) and all(
        isinstance(p, tf.TensorSpec)
        and p.shape.rank is not None
        and p.shape.rank >= 1
        and p.shape[0] is None
        for p in parts
    )


def _to_tensor(value: Any) -> tf.Tensor | tf.RaggedTensor | tf.SparseTensor:
    if isinstance(value, (tf.Tensor, tf.RaggedTensor, tf.SparseTensor)):
        return value
    if isinstance(value, np.ndarray) and value.dtype == object:
        raise ValueError(
            f"x is a NumPy array of dtype object (shape {value.shape}), which TensorFlow cannot "
            "read; usually its rows have different lengths. Pad them to one length "
            "(keras.utils.pad_sequences) or pass tf.ragged.constant(list_of_rows) for ragged "
            "rows; for mixed columns, pass a dict of one array per column."
        )
    return tf.convert_to_tensor(value)


def _rows(tensor: tf.Tensor | tf.RaggedTensor | tf.SparseTensor) -> int:
    if isinstance(tensor, tf.RaggedTensor):
        return int(tensor.nrows())
    if isinstance(tensor, tf.SparseTensor):
        return int(tensor.dense_shape[0])
    return int(tensor.shape[0])


@dataclasses.dataclass(frozen=True)
class _Rows:
    """In-memory rows that batches of indices gather.

    A dense or ragged tensor is kept as it is; a `tf.SparseTensor`, which `tf.gather`
    cannot read, is held as its entries grouped by row.
    """

    tensor: Any = None
    columns: tf.RaggedTensor | None = None  # a sparse tensor's other coordinates, by row
    values: tf.RaggedTensor | None = None  # its values, by row
    dense_shape: tf.Tensor | None = None

    @classmethod
    def of(cls, tensor: Any) -> _Rows:
        if not isinstance(tensor, tf.SparseTensor):
            return cls(tensor=tensor)
        tensor = tf.sparse.reorder(tensor)  # row-major, so each row's entries are together
        rows = tensor.dense_shape[0]
        splits = tf.searchsorted(tensor.indices[:, 0], tf.range(rows + 1), out_type=tf.int64)
        return cls(
            columns=tf.RaggedTensor.from_row_splits(tensor.indices[:, 1:], splits),
            values=tf.RaggedTensor.from_row_splits(tensor.values, splits),
            dense_shape=tensor.dense_shape,
        )

    def gather(self, indices: tf.Tensor) -> Any:
        """The rows at `indices` (a batch of them, or one row for a scalar index)."""
        if self.columns is None:
            return tf.gather(self.tensor, indices)
        columns = tf.gather(self.columns, indices)
        values = tf.gather(self.values, indices)
        if indices.shape.rank == 0:  # one example: its entries, without the row coordinate
            return tf.SparseTensor(columns, values, self.dense_shape[1:])
        position = tf.expand_dims(columns.value_rowids(), 1)
        return tf.SparseTensor(
            tf.concat([position, columns.flat_values], axis=1),
            values.flat_values,
            tf.concat([tf.shape(indices, out_type=tf.int64), self.dense_shape[1:]], axis=0),
        )
