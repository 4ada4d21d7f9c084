"""The workers of a strategy: which one this is, how many, and a collective to share figures.

`position` is what every caller asks ("how many workers does this strategy
span, and which am I?"); it reads the rank `mirrorkit.cluster.cluster_info` computes, the
way TensorFlow numbers its tasks (``chief`` first). `spans_replicas` says whether a
strategy runs more than one replica, on one host or across workers: what most of
mirrorkit's repairs and notices apply by.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from mirrorkit.cluster import cluster_info


def every_strategy(strategy: object) -> bool:
    """True: for a repair every strategy needs (its ``applies_to``), one device's too."""
    return True


def is_multi_worker(strategy: object) -> bool:
    """Whether `strategy` is a `tf.distribute.MultiWorkerMirroredStrategy` (of any size)."""
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)


def position(strategy: tf.distribute.Strategy) -> cluster_info.ClusterInfo:
    """Where this process sits among the workers `strategy` spans.

    For a multi-worker strategy, the cluster and task of its own cluster
    resolver (TF_CONFIG or Slurm); for any other strategy, one worker, with
    this process's task type and chief-ness from the environment (so an
    ``evaluator`` task is said to be one, with no worker index).

    Args:
        strategy: a `tf.distribute.Strategy`.

    Returns:
        A `mirrorkit.cluster.cluster_info.ClusterInfo`; its ``worker_index`` is the rank.

    Example:
    ```python
    import mirrorkit as mk
    from mirrorkit.cluster import workers

    here = workers.position(mk.strategy())
    print(here.worker_index, "of", here.num_workers)
    ```
    """
    if is_multi_worker(strategy):
        resolver = strategy.cluster_resolver
        spec = resolver.cluster_spec().as_dict()
        if spec:
            source = cluster_info.from_environment().source
            return cluster_info.from_cluster_spec(
                spec, resolver.task_type, resolver.task_id, source
            )
        return cluster_info.ALONE
    here = cluster_info.from_environment()
    return dataclasses.replace(
        here,
        num_workers=1,
        worker_index=0 if here.is_training_worker else None,
        addresses=(),
    )


def num_workers(strategy: tf.distribute.Strategy) -> int:
    """How many workers `strategy` spans (1 for anything but a multi-worker strategy)."""
    return position(strategy).num_workers


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
    from mirrorkit.cluster import workers

    strategy = mk.strategy()
    table = workers.gather(strategy, [0.1])  # one row per worker
    ```
    """
    here = position(strategy)
    count, rank = here.num_workers, here.worker_index
    mine = np.asarray(values, np.float64)
    if count == 1:
        return mine[None, :]
    first_local = rank * (strategy.num_replicas_in_sync // count)

    def row(context: tf.distribute.ValueContext) -> tf.Tensor:
        table = np.zeros((count, mine.size))
        if context.replica_id_in_sync_group == first_local:
            table[rank] = mine
        return tf.constant(table, tf.float64)

    rows = strategy.experimental_distribute_values_from_function(row)
    return strategy.reduce("SUM", rows, axis=None).numpy()


def spans_replicas(strategy: tf.distribute.Strategy) -> bool:
    """Whether `strategy` runs more than one replica or spans several workers."""
    return strategy.num_replicas_in_sync > 1 or is_multi_worker(strategy)
