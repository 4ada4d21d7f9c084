"""The one-line verdict on where a training step's time goes, and the fix to try.

From the measured shares of a step: waiting for input (`InputClock`: a
worker's wait for its own batch, not for the other workers), host work
outside Keras's compiled train function (``host_share``: callbacks, logging,
Python between steps), and, with several replicas, the slowest replica's
computation (``compute_share``) and gradient all-reduce
(``communication_share``), on one host as across workers.
"""

from __future__ import annotations

#: A step that waits for data this share of its time or more is input-bound.
INPUT_BOUND_SHARE = 0.2
#: A step that spends this share of its time outside the compiled train function is host-bound.
HOST_BOUND_SHARE = 0.3
#: An epoch whose steady steps explain less than (1 - this) of its wall time has a large overhead.
EPOCH_OVERHEAD_SHARE = 0.3
#: A step whose slowest replica computes less than this share of it is communication-bound,
#: where the all-reduce itself was not timed.
COMMUNICATION_BOUND_SHARE = 0.7
#: A step whose slowest replica spends this share of it in the gradient all-reduce is
#: communication-bound (its all-reduce is the transfer alone: it waits for nobody).
ALL_REDUCE_BOUND_SHARE = 0.3
#: From this share of a step spent with the replicas apart, the verdict says so.
REPLICA_WAIT_SHARE = 0.1
#: From this share of a step that no measured part explains, the verdict says so.
DISPATCH_SHARE = 0.2
#: A step that this share or more of is none of its measured parts (and more than its
#: compute) is dispatch-bound: the replicas' steps are too small for the strategy's own work.
DISPATCH_BOUND_SHARE = 0.4


def verdict(
    input_wait_share: float | None,
    compute_share: float | None,
    waiting_worker: int | None = None,
    *,
    host_share: float | None = None,
    host_worker: int | None = None,
    epoch_overhead_share: float | None = None,
    communication_share: float | None = None,
    replica_wait_share: float | None = None,
    dispatch_share: float | None = None,
) -> str | None:
    """One line: input-, host-, communication-, dispatch- or compute-bound, with the fix to try.

    Args:
        input_wait_share: the measured share of each step spent waiting for data
            (in a multi-worker job the largest of the workers' own shares).
        compute_share: the slowest replica's computation over the step time
            (several replicas), or None.
        waiting_worker: the worker whose input wait that is (multi-worker
            jobs), named in an input-bound verdict.
        host_share: the measured share of each step spent outside the compiled
            train function (callbacks, logging, Python), the largest of the
            workers' in a multi-worker job.
        host_worker: the worker whose host share that is (multi-worker jobs).
        epoch_overhead_share: the share of the epoch's wall time outside its
            steps at the steady rate (iterator start-up, validation,
            epoch-end callbacks); the callback leaves it out for the first
            epoch of each ``fit``, whose tracing is expected.
        communication_share: the gradient all-reduce of the replica that
            reached it last, over the step time, where it was timed (several
            replicas).
        replica_wait_share: the share of a step the replicas spend apart
            (starting late, or waiting for each other), where it was timed.
        dispatch_share: the share of a step none of the others explains: the
            strategy's own work around the replicas' steps.

    Returns:
        The verdict, or None when nothing was measured.

    Example:
    ```python
    from mirrorkit.throughput.bottleneck import verdict

    verdict(0.38, None)
    # 'input-bound: 38% of each step waits for data; add prefetch / parallel map / cache'
    ```
    """
    if input_wait_share is None and compute_share is None:
        return None
    if input_wait_share is not None and input_wait_share >= INPUT_BOUND_SHARE:
        whose = "" if waiting_worker is None else f" on worker {waiting_worker}"
        return (
            f"input-bound: {input_wait_share:.0%} of each step waits for data{whose}; "
            "add prefetch / parallel map / cache"
        )
    if host_share is not None and host_share >= HOST_BOUND_SHARE:
        where = "" if host_worker is None else f" on worker {host_worker}"
        return (
            f"host-bound: {host_share:.0%} of each step is spent outside the compiled step{where} "
            "(callbacks, logging, Python); make per-step callbacks cheaper or raise "
            "steps_per_execution"
        )
    if epoch_overhead_share is not None and epoch_overhead_share >= EPOCH_OVERHEAD_SHARE:
        return (
            f"epoch-overhead: {epoch_overhead_share:.0%} of the epoch is outside its steady steps "
            "(iterator start-up, validation, epoch-end callbacks); train more steps per epoch "
            "(steps_per_epoch with .repeat()) or validate less often (validation_freq)"
        )
    if communication_share is not None and compute_share is not None:
        if communication_share >= ALL_REDUCE_BOUND_SHARE:
            return (
                f"communication-bound: compute share {compute_share:.2f}, all-reduce share "
                f"{communication_share:.2f}; try gradient_compression='fp16', a larger "
                "per-replica batch, or gradient_accumulation_steps"
            )
        if (
            dispatch_share is not None
            and dispatch_share >= DISPATCH_BOUND_SHARE
            and dispatch_share > compute_share
        ):
            return (
                f"dispatch-bound: {dispatch_share:.0%} of each step is the strategy's own work "
                f"around the replicas' steps (compute share {compute_share:.2f}, all-reduce "
                f"share {communication_share:.2f}); give each replica more work a step (a larger "
                "per-replica batch), or use fewer replicas for so small a model"
            )
    elif compute_share is not None and compute_share < COMMUNICATION_BOUND_SHARE:
        return (
            f"communication-bound: compute share {compute_share:.2f}; try "
            "gradient_compression='fp16' or a larger per-replica batch"
        )
    waiting = (
        "" if input_wait_share is None else f"{input_wait_share:.0%} of each step waits for data"
    )
    if compute_share is not None:
        shares = f"compute share {compute_share:.2f}"
        if communication_share is not None:
            shares += f", all-reduce share {communication_share:.2f}"
        if replica_wait_share is not None and replica_wait_share >= REPLICA_WAIT_SHARE:
            shares += (
                f", replicas apart {replica_wait_share:.2f} (they start their steps apart: "
                "CPU replicas share the host's cores)"
            )
        if dispatch_share is not None and dispatch_share >= DISPATCH_SHARE:
            shares += (
                f", dispatch {dispatch_share:.2f} (the strategy's own work around the replicas' "
                "steps; a larger per-replica batch makes it smaller)"
            )
        return f"compute-bound: {shares}" + (f", {waiting}" if waiting else "")
    return f"not input-bound: {waiting}"
