"""Detect whether a tf.data pipeline already batches its elements, and by how much.

tf.data has no public way to ask; this walks the chain of datasets through
their ``_input_dataset`` links (a TensorFlow internal) to the nearest batching
step, passing only steps that keep the batch dimension (map, filter, prefetch,
cache, shuffle, repeat, take, skip, options), and into every input of a
``zip`` or ``concatenate`` (a zip of batched datasets is batched: left
alone, mk.distribute would batch its batches and a model whose layers take
any leading shape, such as Dense, would train on the wrong batches without an
error). ``rebatch`` batches too. The walk checks itself once
on a small probe pipeline: if a TensorFlow release renamed the classes or
links it relies on, `find` raises `mirrorkit.internals.InternalChangedError`
instead of reporting "not batched" (which would batch the data twice).
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from mirrorkit import internals

#: Dataset classes (by name) that batch, and those that undo batching.
_BATCHING = (
    "_BatchDataset", "_ParallelBatchDataset", "BatchDataset", "ParallelBatchDataset",
    "_RebatchDataset", "_LegacyRebatchDataset",
)  # fmt: skip
_PADDED = ("_PaddedBatchDataset", "PaddedBatchDataset")
_UNBATCHING = ("_UnbatchDataset", "UnbatchDataset")
#: Steps whose elements are whole elements of their inputs: batched if an input is.
_MERGING = ("Zip", "Concatenate")
#: The private links the walk follows (TensorFlow 2.17-2.21).
_INPUT_LINK = "_input_dataset"
_SIZE_FIELD = "_batch_size"
_verified = False
_USED_FOR = "mk.distribute telling whether a dataset is already batched"
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
    ```python
    import tensorflow as tf

    from mirrorkit.pipeline.batched import find

    assert find(tf.data.Dataset.range(10).batch(4).prefetch(1)).batch_size == 4
    assert find(tf.data.Dataset.range(10)) is None
    ```
    """
    _verify()
    return _walk(dataset, max_depth)


def _walk(dataset: tf.data.Dataset, max_depth: int = 64) -> Batching | None:
    node = dataset
    for _ in range(max_depth):
        name = type(node).__name__
        if name in _BATCHING or name in _PADDED:
            size = tf.get_static_value(getattr(node, _SIZE_FIELD, None))
            return Batching(None if size is None else int(size), name in _PADDED)
        if name in _UNBATCHING:
            return None
        stem = name.lstrip("_").removesuffix("Dataset")
        if stem in _MERGING:
            inputs = internals.require(
                node, "_inputs", name="tf.data Dataset._inputs()", used_for=_USED_FOR
            )()
            found = [f for f in (_walk(d, max_depth) for d in inputs) if f is not None]
            return found[0] if found else None
        if stem not in _TRANSPARENT:
            return None
        node = getattr(node, _INPUT_LINK, None)
        if node is None:
            return None
    return None


def _verify() -> None:
    """Checks once that the walk still sees batching in known pipelines (tf.data internals)."""
    global _verified
    if _verified:
        return
    probes = {
        "Dataset.range(4).map(f).batch(2).prefetch(1)": (
            tf.data.Dataset.range(4).map(lambda x: x).batch(2).prefetch(1),
            Batching(2, False),
        ),
        "Dataset.range(4).padded_batch(2)": (
            tf.data.Dataset.range(4).padded_batch(2),
            Batching(2, True),
        ),
        "Dataset.zip((Dataset.range(4).batch(2), Dataset.range(4).batch(2)))": (
            tf.data.Dataset.zip(
                (tf.data.Dataset.range(4).batch(2), tf.data.Dataset.range(4).batch(2))
            ),
            Batching(2, False),
        ),
    }
    for label, (probe, want) in probes.items():
        got = _walk(probe)
        if got != want:
            raise internals.changed(
                f"tf.data dataset classes ({', '.join(_BATCHING)}) and their "
                f"{_INPUT_LINK}/{_SIZE_FIELD} fields",
                _USED_FOR,
                f"the walk over {label} found {got}, not {want} ({type(probe).__name__})",
            )
    _verified = True
