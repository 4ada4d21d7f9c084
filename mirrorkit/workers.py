"""The workers of a strategy: how many, and one collective to share a figure from each."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from mirrorkit import cluster


def is_multi_worker(strategy: object) -> bool:
    """Whether `strategy` is a `tf.distribute.MultiWorkerMirroredStrategy` (of any size)."""
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)


def num_workers(strategy: tf.distribute.Strategy) -> int:
    """How many workers `strategy` spans (1 for anything but a multi-worker strategy)."""
    if is_multi_worker(strategy):
        return cluster.from_environment().num_workers
    return 1


def gather(strategy: tf.distribute.Strategy, values: Sequence[float]) -> np.ndarray:
    """Every worker's `values`, row i from worker i, exchanged by one all-reduce.

    Every worker must call it at the same point (it is a collective). Only the
    first local replica of each worker contributes its row, so the sum of the
    rows is the table of all workers' values.

    Args:
        strategy: the strategy whose workers exchange.
        values: this worker's figures, the same length on every worker.

    Returns:
        A ``(workers, len(values))`` float64 array.

    Example:
    ```python
    import mirrorkit as mk
    from mirrorkit import workers

    strategy = mk.strategy()
    table = workers.gather(strategy, [0.1])  # one row per worker
    ```
    """
    count = num_workers(strategy)
    mine = np.asarray(values, np.float64)
    if count == 1:
        return mine[None, :]
    rank = cluster.from_environment().task_index
    first_local = rank * (strategy.num_replicas_in_sync // count)

    def row(context: tf.distribute.ValueContext) -> tf.Tensor:
        table = np.zeros((count, mine.size))
        if context.replica_id_in_sync_group == first_local:
            table[rank] = mine
        return tf.constant(table, tf.float64)

    rows = strategy.experimental_distribute_values_from_function(row)
    return strategy.reduce("SUM", rows, axis=None).numpy()
