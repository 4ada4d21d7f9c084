"""Per-replica figures of an epoch, from `StepClock`'s intervals: who is slow, where time goes.

Each replica's medians of its three intervals (`step_clock.INTERVALS`:
compute, all-reduce, update) become, in global replica order (worker by
worker), the report's per-replica columns; the slowest replica's tell how a
step divides: the slowest replica's compute share, the communication share
(the shortest all-reduce of any replica: the replica that reaches the
all-reduce last waits for nobody, so its all-reduce is the transfer alone)
and the update share; what remains of the longest replica's step is the wait
share (replicas that start their steps, or reach the all-reduce, apart: on
one host's CPUs they queue for its threads). The straggler rule that finds a slow worker
(`stragglers.find_straggler`) finds a slow replica among all of them, on one
host as across workers.
"""

from __future__ import annotations

import numpy as np

from mirrorkit.throughput.report import EpochThroughput
from mirrorkit.throughput.step_clock import INTERVALS, ReplicaTimes
from mirrorkit.throughput.stragglers import find_straggler


def local_medians(times: ReplicaTimes, skip: int) -> np.ndarray:
    """This worker's replicas' median seconds of each interval: shape (replicas, intervals).

    Args:
        times: what `StepClock.read_new` read.
        skip: leading steps to leave out (the warm-up of a fit's first epoch); at least one
            step is kept.

    Returns:
        Zeros of shape (replicas, intervals) when no step was read.
    """
    replicas = times.compute.shape[0] if times.compute.ndim == 2 else 0
    if times.steps == 0:
        return np.zeros((replicas, len(INTERVALS)))
    skip = min(skip, times.steps - 1)
    columns = [getattr(times, name)[:, skip:] for name in INTERVALS]
    return np.stack([np.median(column, axis=1) for column in columns], axis=1)


def fill(
    figures: EpochThroughput,
    medians: np.ndarray,
    num_workers: int,
    per_replica_batch: float | None,
    factor: float,
    min_gap_s: float,
) -> None:
    """Puts the per-replica, per-worker and share figures of `medians` into `figures`.

    Args:
        figures: the epoch's figures, its step times already in.
        medians: every replica's medians, shape (replicas, intervals), in global order.
        num_workers: the job's workers (each holds an equal run of the replicas).
        per_replica_batch: examples a replica takes a step, for its own examples/s.
        factor: the straggler factor.
        min_gap_s: the straggler gap in seconds.
    """
    if medians.size == 0 or medians[:, 0].min() <= 0:
        return
    compute, all_reduce, update = (medians[:, k] for k in range(len(INTERVALS)))
    step = figures.step_time_median_s
    slowest = int(np.argmax(compute))
    if len(compute) > 1:
        figures.replica_compute_median_s = [float(v) for v in compute]
        figures.replica_all_reduce_median_s = [float(v) for v in all_reduce]
        figures.replica_update_median_s = [float(v) for v in update]
        if per_replica_batch:
            figures.replica_examples_per_sec = [
                float(per_replica_batch / own) for own in compute + update
            ]
        if len(compute) > num_workers:  # one replica a worker: the worker figures say it
            figures.slowest_replica = slowest
            figures.replica_spread = float(compute.max() / compute.min())
            figures.slow_replica = find_straggler(list(compute), factor, min_gap_s)
    if step > 0:
        figures.compute_share = float(compute[slowest] / step)
        figures.communication_share = float(all_reduce.min() / step)
        figures.update_share = float(update[slowest] / step)
        longest = float((compute + all_reduce + update).max())
        rest = longest - compute[slowest] - all_reduce.min() - update[slowest]
        figures.replica_wait_share = float(max(rest, 0.0) / step)
    if num_workers > 1:
        per_worker = compute.reshape(num_workers, -1).max(axis=1)
        figures.worker_compute_median_s = [float(v) for v in per_worker]
        figures.slowest_worker = int(np.argmax(per_worker))
        figures.spread = float(per_worker.max() / per_worker.min())
        figures.straggler = find_straggler(list(per_worker), factor, min_gap_s)


def dispatch_share(figures: EpochThroughput) -> float | None:
    """What the measured shares leave of a step (the strategy's own work), or None unmeasured.

    Args:
        figures: an epoch's figures, its shares (`fill`) and input-wait and host shares in.
    """
    shares = (
        figures.compute_share,
        figures.communication_share,
        figures.update_share,
        figures.replica_wait_share,
    )
    if None in shares:
        return None
    rest = 1.0 - sum(shares) - (figures.input_wait_share or 0.0) - (figures.host_share or 0.0)
    return max(rest, 0.0)
