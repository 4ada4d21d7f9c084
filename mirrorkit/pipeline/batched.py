"""Detect whether a tf.data pipeline already batches its elements, and by how much.

tf.data has no public way to ask; this walks the chain of datasets through
their ``_input_dataset`` links (a TensorFlow internal) to the nearest batching
step, passing only steps that keep the batch dimension (map, filter, prefetch,
cache, shuffle, repeat, take, skip, options), and into every input of a
``zip`` or ``concatenate`` (a zip of batched datasets is batched: left
alone, mk.distribute would batch its batches and a model whose layers take
any leading shape, such as Dense, would train on the wrong batches without an
error). ``rebatch`` batches too. It also reads the batching step's
``drop_remainder`` and, where every step above it keeps one element per batch
(map, prefetch, cache, shuffle of batches, options), how many examples the
batches hold: the cardinality of the batching step's input. The walk checks itself once
on a small probe pipeline: if a TensorFlow release renamed the classes or
links it relies on, `find` raises `mirrorkit.internals.InternalChangedError`
instead of reporting "not batched" (which would batch the data twice).
"""

from __future__ import annotations

import dataclasses
import math

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
_DROP_FIELD = "_drop_remainder"
_RESHUFFLE_FIELD = "_reshuffle_each_iteration"
_verified = False
_USED_FOR = "mk.distribute telling whether a dataset is already batched"
#: Steps the walk may pass: they keep elements' leading (batch) dimension.
_TRANSPARENT = (
    "Map", "ParallelMap", "Filter", "Prefetch", "Cache", "Shuffle", "Repeat", "Take", "Skip",
    "Options", "AssertCardinality", "IgnoreErrors", "Apply",
)  # fmt: skip
#: Of those, the steps that give exactly one element per input element (batches stay whole).
_ONE_TO_ONE = ("Map", "ParallelMap", "Prefetch", "Cache", "Shuffle", "Options", "AssertCardinality")


@dataclasses.dataclass(frozen=True)
class Batching:
    """How a pipeline batches.

    Attributes:
        batch_size: examples per batch (None if not static).
        padded: whether the batches are made by ``padded_batch``.
        drop_remainder: whether the batching step drops a last partial batch
            (False when unknown).
        num_examples: how many examples the pipeline's batches hold in all,
            when the batching step's input has a known cardinality and every
            step above it keeps one element per batch; else None.
    """

    batch_size: int | None
    padded: bool
    drop_remainder: bool = False
    num_examples: int | None = None

    @property
    def last_batch_size(self) -> int | None:
        """Examples in the last batch (a partial one, or a whole one); None when unknown."""
        if self.num_examples is None or not self.batch_size:
            return None
        return self.num_examples - (math.ceil(self.num_examples / self.batch_size) - 1) * (
            self.batch_size
        )


def find(dataset: tf.data.Dataset, max_depth: int = 64) -> Batching | None:
    """Returns how `dataset` is batched, or None when no batching step is found.

    Example:
    ```python
    import tensorflow as tf

    from mirrorkit.pipeline.batched import find

    found = find(tf.data.Dataset.range(10).batch(4).prefetch(1))
    assert (found.batch_size, found.num_examples, found.last_batch_size) == (4, 10, 2)
    assert find(tf.data.Dataset.range(10)) is None
    ```
    """
    _verify()
    return _walk(dataset, max_depth)


def _walk(dataset: tf.data.Dataset, max_depth: int = 64) -> Batching | None:
    node = dataset
    whole = True  # every step so far gives one element per batch
    for _ in range(max_depth):
        name = type(node).__name__
        if name in _BATCHING or name in _PADDED:
            return _batching(node, name, whole)
        if name in _UNBATCHING:
            return None
        stem = name.lstrip("_").removesuffix("Dataset")
        if stem in _MERGING:
            inputs = internals.require(
                node, "_inputs", name="tf.data Dataset._inputs()", used_for=_USED_FOR
            )()
            found = [f for f in (_walk(d, max_depth) for d in inputs) if f is not None]
            return dataclasses.replace(found[0], num_examples=None) if found else None
        if stem not in _TRANSPARENT:
            return None
        whole = whole and stem in _ONE_TO_ONE
        node = getattr(node, _INPUT_LINK, None)
        if node is None:
            return None
    return None


def _batching(node: tf.data.Dataset, name: str, whole: bool) -> Batching:
    """What a batching step says of itself; the example count when `whole` lets it be known."""
    size = tf.get_static_value(getattr(node, _SIZE_FIELD, None))
    size = None if size is None else int(size)
    drop = bool(tf.get_static_value(getattr(node, _DROP_FIELD, False)))
    count = None
    source = getattr(node, _INPUT_LINK, None)
    if whole and size and source is not None:
        below = int(source.cardinality())
        if below >= 0:
            count = below // size * size if drop else below
    return Batching(size, name in _PADDED, drop, count)


def _verify() -> None:
    """Checks once that the walk still sees batching in known pipelines (tf.data internals)."""
    global _verified
    if _verified:
        return
    probes = {
        "Dataset.range(5).map(f).batch(2).prefetch(1)": (
            tf.data.Dataset.range(5).map(lambda x: x).batch(2).prefetch(1),
            Batching(2, False, False, 5),
        ),
        "Dataset.range(5).batch(2, drop_remainder=True)": (
            tf.data.Dataset.range(5).batch(2, drop_remainder=True),
            Batching(2, False, True, 4),
        ),
        "Dataset.range(4).padded_batch(2)": (
            tf.data.Dataset.range(4).padded_batch(2),
            Batching(2, True, False, 4),
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
                f"{_INPUT_LINK}/{_SIZE_FIELD}/{_DROP_FIELD} fields",
                _USED_FOR,
                f"the walk over {label} found {got}, not {want} ({type(probe).__name__})",
            )
    cached_shuffles = {
        "Dataset.range(4).shuffle(4).batch(2).cache()": (
            tf.data.Dataset.range(4).shuffle(4).batch(2).cache(),
            True,
        ),
        "Dataset.range(4).shuffle(4, reshuffle_each_iteration=False).cache()": (
            tf.data.Dataset.range(4).shuffle(4, reshuffle_each_iteration=False).cache(),
            False,
        ),
    }
    for label, (probe, want) in cached_shuffles.items():
        got = _caches_a_shuffle(probe)
        if got != want:
            raise internals.changed(
                f"tf.data's CacheDataset/ShuffleDataset classes, {_INPUT_LINK} and "
                f"{_RESHUFFLE_FIELD}",
                "mk.distribute telling whether a dataset caches after a shuffle",
                f"the walk over {label} found {got}, not {want}",
            )
    _verified = True


def caches_a_shuffle(dataset: tf.data.Dataset, max_depth: int = 64) -> bool:
    """Whether `dataset` caches elements that an earlier step shuffled (``shuffle().cache()``).

    Once such a cache is complete, every later epoch replays the first epoch's
    order. Whether it completes depends on how far an iterator reads past the
    last element, which differs between one device and N replicas.

    Example:
    ```python
    import tensorflow as tf

    from mirrorkit.pipeline.batched import caches_a_shuffle

    assert caches_a_shuffle(tf.data.Dataset.range(8).shuffle(8).batch(2).cache())
    assert not caches_a_shuffle(tf.data.Dataset.range(8).cache().shuffle(8).batch(2))
    assert not caches_a_shuffle(
        tf.data.Dataset.range(8).shuffle(8, reshuffle_each_iteration=False).cache()
    )
    ```
    """
    _verify()
    return _caches_a_shuffle(dataset, max_depth)


def reshuffles(dataset: tf.data.Dataset, max_depth: int = 64) -> bool:
    """Whether `dataset` shuffles again on every pass (``shuffle(..., reshuffle_each_iteration)``).

    A repeated pass of such a pipeline draws its orders otherwise than a new
    iterator per pass does, so ``fit`` keeps an iterator per epoch for it
    (`mirrorkit.pipeline.repeating`). A pipeline the walk cannot follow to its
    sources (deeper than `max_depth`) counts as reshuffling.

    Example:
    ```python
    import tensorflow as tf

    from mirrorkit.pipeline.batched import reshuffles

    assert reshuffles(tf.data.Dataset.range(8).shuffle(8).batch(2))
    assert not reshuffles(tf.data.Dataset.range(8).shuffle(8, reshuffle_each_iteration=False))
    assert not reshuffles(tf.data.Dataset.range(8).batch(2).prefetch(1))
    ```
    """
    _verify()
    return _reshuffles(dataset, max_depth)


def _reshuffles(dataset: tf.data.Dataset, max_depth: int) -> bool:
    node = dataset
    for _ in range(max_depth):
        stem = type(node).__name__.lstrip("_").removesuffix("Dataset")
        if stem == "Shuffle" and getattr(node, _RESHUFFLE_FIELD, True):
            return True
        inputs = internals.require(
            node, "_inputs", name="tf.data Dataset._inputs()", used_for=_USED_FOR
        )()
        if len(inputs) != 1:  # a source (none) or a zip/concatenation (several)
            return any(_reshuffles(d, max_depth) for d in inputs)
        node = inputs[0]
    return True


def _caches_a_shuffle(dataset: tf.data.Dataset, max_depth: int = 64) -> bool:
    node, cached = dataset, False
    for _ in range(max_depth):
        stem = type(node).__name__.lstrip("_").removesuffix("Dataset")
        if stem == "Cache":
            cached = True
        elif stem == "Shuffle" and cached and getattr(node, _RESHUFFLE_FIELD, True):
            return True
        node = getattr(node, _INPUT_LINK, None)
        if node is None:
            return False
    return False


def shards(dataset: tf.data.Dataset, max_depth: int = 64) -> bool:
    """Whether `dataset` already takes one shard of its input (``dataset.shard(n, i)``).

    Example:
    ```python
    import tensorflow as tf

    from mirrorkit.pipeline.batched import shards

    assert shards(tf.data.Dataset.range(8).shard(2, 0).batch(2))
    assert not shards(tf.data.Dataset.range(8).batch(2))
    ```
    """
    _verify()
    node = dataset
    for _ in range(max_depth):
        if type(node).__name__.lstrip("_").removesuffix("Dataset") == "Shard":
            return True
        inputs = internals.require(
            node, "_inputs", name="tf.data Dataset._inputs()", used_for=_USED_FOR
        )()
        if len(inputs) != 1:
            return any(shards(d, max_depth) for d in inputs)
        node = inputs[0]
    return False
