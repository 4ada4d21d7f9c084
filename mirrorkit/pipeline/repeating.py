"""The twin of an `mk.distribute` dataset that repeats its epochs, so ``fit`` keeps one iterator.

Keras's ``fit`` makes a new iterator over its input every epoch unless it is
told ``steps_per_epoch`` and the input is endless; a distributed iterator is
costly to make (a thread and a prefetch buffer per device, and the input
pipeline started again), which was half the wall time of small epochs and of
validation every epoch (docs: benchmarks/#one-iterator-per-fit).
`mirrorkit.feeding.one_iterator` hands ``fit`` this twin, with the epoch length
as ``steps_per_epoch`` (and ``validation_steps``): the same pipeline, batched,
then repeated, so no batch spans two epochs and every epoch is the one the
dataset itself gives (its examples, its dropped remainder, its order). An
in-memory shuffle's order of epoch e is drawn from (seed, e)
(`mirrorkit.pipeline.epoch_order`): the twin's iterator reads the epoch where
its ``fit`` begins (its ``initial_epoch``, a restored backup's epoch) and
counts the next ones itself.

The twin is made once per dataset, on first use, and only for a dataset
whose epoch length is known and whose order a repeated pass keeps: not for a
pipeline that shuffles itself again on every pass (a ``shuffle`` in the
user's tf.data pipeline, a streamed shuffle), whose orders would then be
drawn differently from an iterator per epoch. A dataset the user distributed
without mirrorkit is never changed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from mirrorkit import distributed_data
from mirrorkit.pipeline import batched

#: Builds the repeating twin: ``make(class_weight)`` (None: the dataset's own weights).
Maker = Callable[[Any], tf.distribute.DistributedDataset]


def attach(made: tf.distribute.DistributedDataset, make: Maker, data: Any) -> None:
    """Lets ``fit`` ask `made` for its repeating twin (`twin`), built on first use.

    Nothing is attached when a repeated pass would not give the orders of an
    iterator per epoch: a shuffled stream, or a tf.data pipeline of the user's
    that shuffles itself again on every pass.

    Args:
        made: the dataset `mk.distribute` returns.
        make: builds the twin; called with ``class_weight`` (or None).
        data: what the caller gave `mk.distribute`.
    """
    streamed = distributed_data.record(made).shuffle_stream is not None
    if streamed or (isinstance(data, tf.data.Dataset) and batched.reshuffles(data)):
        distributed_data.update(made, repeating_twin=None)
        return
    distributed_data.update(made, repeating_twin=_Twin(make))


class _Twin:
    """The repeating twin of one dataset, made on first use; its class-weighted twins too."""

    def __init__(self, make: Maker):
        self._make = make
        self._made: tf.distribute.DistributedDataset | None = None

    def get(self) -> tf.distribute.DistributedDataset:
        if self._made is None:
            self._made = _build(self._make, None)
        return self._made


def _build(make: Maker, class_weight: Any) -> tf.distribute.DistributedDataset:
    made = make(class_weight)
    # fit(class_weight=) on the twin: class weights in its pipeline, repeating too. The maker,
    # not the _Twin that holds this twin: no reference cycle, so the twin (and the iterator
    # evaluate and predict keep on it) goes as soon as its dataset does.
    # A twin has no twin; evaluate/predict keep their iterator at an epoch boundary for it
    # (distributed_data.keep_iterator).
    distributed_data.update(
        made, with_class_weight=functools.partial(_build, make), repeating_twin=None, is_twin=True
    )
    return made
