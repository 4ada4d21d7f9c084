"""What a dataset `mk.distribute` returns carries besides TensorFlow's own, in one record.

`mk.distribute` returns TensorFlow's own ``tf.distribute.DistributedDataset``. What mirrorkit
knows about it is one frozen `DistributedRecord`, which the pipeline (`mirrorkit.pipeline`)
writes with `set_record` / `update` and every other part of mirrorkit reads through `record`
(or the small readers below): its batch sizes and epoch length, its shuffle, the maker of its
repeating twin, its class-weighted rebuild. The record is kept beside the dataset (held
weakly), not on it. Five of its fields are public, and `set_record` also sets them as
attributes on the dataset, where users read them: ``global_batch_size``,
``per_replica_batch_size``, ``num_examples``, ``steps_per_epoch`` and ``dropped_per_epoch``.

This module imports nothing of mirrorkit, so every package may read the contract.

Example:
```python
import numpy as np
import mirrorkit as mk
from mirrorkit import distributed_data

strategy = mk.strategy(cpu_replicas=2)
data = mk.distribute((np.ones((40, 3)), np.ones((40, 1))), strategy, global_batch_size=8)
print(distributed_data.record(data).steps_per_epoch, distributed_data.same_every_epoch(data))
# 5 False
```
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable
from typing import Any

#: The fields users read as attributes of the dataset (`set_record` sets them there too).
PUBLIC = (
    "global_batch_size",
    "per_replica_batch_size",
    "num_examples",
    "steps_per_epoch",
    "dropped_per_epoch",
)


@dataclasses.dataclass(frozen=True)
class DistributedRecord:
    """What mirrorkit knows about one dataset `mk.distribute` returned.

    Attributes:
        global_batch_size: examples per step, over every replica of every worker.
        per_replica_batch_size: examples per step on each replica.
        num_examples: the examples of one epoch (None: unknown, a stream).
        steps_per_epoch: the steps of one epoch on this worker (None: unknown).
        dropped_per_epoch: examples left out of each epoch by ``drop_remainder``.
        epoch_order: its in-memory shuffle, which resumes replay (None: not shuffled so).
        shuffle_stream: marks a shuffled stream, whose orders are not replayed (None: none).
        with_class_weight: rebuilds the same input with class weights in its pipeline.
        repeating_twin: makes its repeating twin, once (None: it has none).
        is_twin: whether this dataset is a repeating twin (what ``fit`` reads instead).
    """

    global_batch_size: int
    per_replica_batch_size: int
    num_examples: int | None
    steps_per_epoch: int | None
    dropped_per_epoch: int
    epoch_order: Any = None
    shuffle_stream: Any = None
    with_class_weight: Callable[..., Any] | None = None
    repeating_twin: Any = None
    is_twin: bool = False


#: dataset -> its record; held weakly, so the record goes with the dataset.
_RECORDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: twin -> the iterator ``evaluate``/``predict`` left at an epoch boundary (`keep_iterator`).
_KEPT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def record(data: Any) -> DistributedRecord | None:
    """The record of a dataset `mk.distribute` made, or None for any other input.

    Args:
        data: any input of ``fit``, ``evaluate`` or ``predict``.
    """
    try:
        return _RECORDS.get(data)
    except TypeError:  # not hashable, not weakly referable: no dataset of mk.distribute
        return None


def set_record(data: Any, made: DistributedRecord) -> Any:
    """Gives `data` its record, and its public fields as attributes; returns `data`.

    Args:
        data: the ``tf.distribute.DistributedDataset`` the pipeline made.
        made: what mirrorkit knows about it.
    """
    _RECORDS[data] = made
    for name in PUBLIC:
        setattr(data, name, getattr(made, name))
    return data


def update(data: Any, **changes: Any) -> DistributedRecord:
    """Replaces fields of `data`'s record (a new frozen record); returns it.

    Args:
        data: a dataset with a record (`set_record`).
        **changes: the fields to change.

    Raises:
        KeyError: `data` has no record.
    """
    changed = dataclasses.replace(_RECORDS[data], **changes)
    set_record(data, changed)
    return changed


def made_here(data: Any) -> bool:
    """Whether `data` is a dataset `mk.distribute` made (twin or not).

    Args:
        data: any input of ``fit``, ``evaluate`` or ``predict``.
    """
    return record(data) is not None


def epoch_length(data: Any) -> int | None:
    """The steps of one epoch of `data` when it is an `mk.distribute` dataset with a twin.

    Args:
        data: any input of ``fit``, ``evaluate`` or ``predict``.
    """
    found = record(data)
    if found is None or found.repeating_twin is None:
        return None
    return int(found.steps_per_epoch) if found.steps_per_epoch else None


def is_twin(data: Any) -> bool:
    """Whether `data` is a repeating twin (what ``fit`` reads instead of the dataset).

    Args:
        data: any input of ``fit``, ``evaluate`` or ``predict``.
    """
    found = record(data)
    return found is not None and found.is_twin


def same_every_epoch(data: Any) -> bool:
    """Whether every epoch of `data` (an `mk.distribute` dataset) gives the same batches in order.

    True when it is not shuffled: ``evaluate`` and ``predict`` may then read one
    iterator across calls, each call the next epoch.

    Args:
        data: a dataset `mk.distribute` made.
    """
    found = record(data)
    return found is None or (found.epoch_order is None and found.shuffle_stream is None)


def twin(data: Any) -> Any:
    """`data`'s repeating twin (made once), for ``fit`` with ``steps_per_epoch=epoch_length``.

    Args:
        data: a dataset `mk.distribute` made, whose `epoch_length` is not None.
    """
    return record(data).repeating_twin.get()


def class_weight_maker(data: Any) -> Any:
    """``with_class_weight`` of an `mk.distribute` dataset (its input with class weights), or None.

    Args:
        data: any input of ``fit``.
    """
    found = record(data)
    return found.with_class_weight if found is not None else None


def take_kept_iterator(twin: Any) -> Any:
    """The iterator an earlier ``evaluate``/``predict`` left on `twin` (removed from it), or None.

    Args:
        twin: a repeating twin.
    """
    return _KEPT.pop(twin, None)


def kept_iterator(twin: Any) -> Any:
    """The iterator kept for `twin` (`keep_iterator`), left in place; None when there is none.

    Args:
        twin: a repeating twin.
    """
    return _KEPT.get(twin)


def keep_iterator(twin: Any, iterator: Any) -> None:
    """Keeps `iterator` on `twin` for the next call (None: keep nothing).

    Args:
        twin: a repeating twin.
        iterator: an iterator over `twin` left at an epoch boundary, or None.
    """
    if iterator is None:
        _KEPT.pop(twin, None)
    else:
        _KEPT[twin] = iterator
