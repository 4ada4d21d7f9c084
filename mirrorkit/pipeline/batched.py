"""Detect whether a tf.data pipeline already batches its elements, and by how much.

tf.data has no public way to ask; this walks the chain of datasets through
their ``_input_dataset`` links (a TensorFlow internal) to the nearest batching
step, passing only steps that keep the batch dimension (map, filter, prefetch,
cache, shuffle, repeat, take, skip, options).
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

#: Dataset classes (by name) that batch, and those that undo batching.
_BATCHING = ("_BatchDataset", "_ParallelBatchDataset", "BatchDataset", "ParallelBatchDataset")
_PADDED = ("_PaddedBatchDataset", "PaddedBatchDataset")
_UNBATCHING = ("_UnbatchDataset", "UnbatchDataset", "_RebatchDataset", "_LegacyRebatchDataset")
#: Steps the walk may pass: they keep elements' leading (batch) dimension.
_TRANSPARENT = (
    "Map", "ParallelMap", "Filter", "Prefetch", "Cache", "Shuffle", "Repeat", "Take", "Skip",
    "Options", "AssertCardinality", "IgnoreErrors", "Apply",
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Batching:
    """How a pipeline batches: size (None if not static) and whether padded."""

    batch_size: int | None
    padded: bool


def find(dataset: tf.data.Dataset, max_depth: int = 64) -> Batching | None:
    """Returns how `dataset` is batched, or None when no batching step is found.

    Example:
    >>> import tensorflow as tf
    >>> find(tf.data.Dataset.range(10).batch(4).prefetch(1)).batch_size
    4
    >>> find(tf.data.Dataset.range(10)) is None
    True
    """
    node = dataset
    for _ in range(max_depth):
        name = type(node).__name__
        if name in _BATCHING or name in _PADDED:
            size = tf.get_static_value(getattr(node, "_batch_size", None))
            return Batching(None if size is None else int(size), name in _PADDED)
        if name in _UNBATCHING:
            return None
        stem = name.lstrip("_").removesuffix("Dataset")
        if stem not in _TRANSPARENT:
            return None
        node = getattr(node, "_input_dataset", None)
        if node is None:
            return None
    return None
