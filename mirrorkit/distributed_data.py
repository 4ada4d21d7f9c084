"""What a dataset `mk.distribute` returns carries besides TensorFlow's own, read in one place.

`mk.distribute` returns TensorFlow's own ``tf.distribute.DistributedDataset``, with
attributes set on it by the pipeline (`mirrorkit.pipeline`). Five are public and users
read them: ``global_batch_size``, ``per_replica_batch_size``, ``num_examples``,
``steps_per_epoch`` and ``dropped_per_epoch``. The others are mirrorkit's own, and the
parts of mirrorkit that act on such a dataset outside the pipeline (the one-iterator
repair, class weights at ``fit``) read them through the functions here:

- ``repeating_twin``: the maker of the dataset's repeating twin (None: it has none);
- ``is_repeating_twin``: set on a twin;
- ``epoch_order`` and ``shuffle_stream``: its in-memory or streamed shuffle (None: none);
- ``with_class_weight``: the same input with class weights in its pipeline;
- ``kept_iterator``: on a twin, the iterator ``evaluate`` and ``predict`` left at an
  epoch boundary.

This module imports nothing of mirrorkit, so every package may read the contract.

Example:
```python
import numpy as np
import mirrorkit as mk
from mirrorkit import distributed_data

strategy = mk.strategy(cpu_replicas=2)
data = mk.distribute((np.ones((40, 3)), np.ones((40, 1))), strategy, global_batch_size=8)
print(distributed_data.epoch_length(data), distributed_data.same_every_epoch(data))  # 5 False
```
"""

from __future__ import annotations

from typing import Any


def made_here(data: Any) -> bool:
    """Whether `data` is a dataset `mk.distribute` made (twin or not).

    Args:
        data: any input of ``fit``, ``evaluate`` or ``predict``.
    """
    return hasattr(data, "repeating_twin")  # set by mirrorkit.pipeline.repeating.attach


def epoch_length(data: Any) -> int | None:
    """The steps of one epoch of `data` when it is an `mk.distribute` dataset with a twin.

    Args:
        data: any input of ``fit``, ``evaluate`` or ``predict``.
    """
    if getattr(data, "repeating_twin", None) is None:  # mirrorkit's own attribute
        return None
    steps = getattr(data, "steps_per_epoch", None)  # set by mk.distribute (assemble.describe)
    return int(steps) if steps else None


def is_twin(data: Any) -> bool:
    """Whether `data` is a repeating twin (what ``fit`` reads instead of the dataset).

    Args:
        data: any input of ``fit``, ``evaluate`` or ``predict``.
    """
    return getattr(data, "is_repeating_twin", False)  # mirrorkit's own attribute


def same_every_epoch(data: Any) -> bool:
    """Whether every epoch of `data` (an `mk.distribute` dataset) gives the same batches in order.

    True when it is not shuffled: ``evaluate`` and ``predict`` may then read one
    iterator across calls, each call the next epoch.

    Args:
        data: a dataset `mk.distribute` made.
    """
    return (
        getattr(data, "epoch_order", None) is None and getattr(data, "shuffle_stream", None) is None
    )  # set by mk.distribute for an in-memory or streamed shuffle


def twin(data: Any) -> Any:
    """`data`'s repeating twin (made once), for ``fit`` with ``steps_per_epoch=epoch_length``.

    Args:
        data: a dataset `mk.distribute` made, whose `epoch_length` is not None.
    """
    return data.repeating_twin.get()


def class_weight_maker(data: Any) -> Any:
    """``with_class_weight`` of an `mk.distribute` dataset (its input with class weights), or None.

    Args:
        data: any input of ``fit``.
    """
    rebuild = getattr(data, "with_class_weight", None)  # set by mk.distribute
    return rebuild if callable(rebuild) else None


def take_kept_iterator(twin: Any) -> Any:
    """The iterator an earlier ``evaluate``/``predict`` left on `twin` (removed from it), or None.

    Args:
        twin: a repeating twin.
    """
    kept = getattr(twin, "kept_iterator", None)
    if kept is not None:
        twin.kept_iterator = None
    return kept


def keep_iterator(twin: Any, iterator: Any) -> None:
    """Keeps `iterator` on `twin` for the next call (None: keep nothing).

    Args:
        twin: a repeating twin.
        iterator: an iterator over `twin` left at an epoch boundary, or None.
    """
    twin.kept_iterator = iterator
