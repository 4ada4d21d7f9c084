"""`mk.launch`: run a function as N multi-worker processes, from a notebook or script."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mirrorkit.cluster import cluster_info
from mirrorkit.launcher import local_job
from mirrorkit.number_checks import positive_int


def launch(
    fn: Callable[..., Any],
    num_workers: int = 2,
    args: Sequence[Any] = (),
    *,
    timeout_s: float | None = None,
    pin_cpus: bool = True,
    private_network: bool = True,
    reach: Sequence[str] = (),
    tf_startup_logs: bool = False,
) -> Any:
    """Runs ``fn(*args)`` in `num_workers` fresh worker processes of one job.

    Each worker is a new Python interpreter (spawned, never forked) whose
    ``TF_CONFIG`` names every worker on loopback with free ports, so
    ``mk.strategy()`` inside ``fn`` makes a `MultiWorkerMirroredStrategy` that
    talks through TensorFlow's collective runtime. Output streams back with a
    ``[wN]`` prefix. A function defined in a notebook cell travels as it is.

    Args:
        fn: the training function; it builds its strategy, model and data.
        num_workers: how many workers.
        args: positional arguments for ``fn``, the same for every worker.
        timeout_s: stop every worker and raise `TimeoutError` after this long.
        pin_cpus: give each worker its own CPU cores and TensorFlow thread
            pools of that size (said once; skipped when there are fewer cores
            than workers).
        private_network: run the workers in a private network namespace so
            their unauthenticated TensorFlow servers are unreachable from
            outside; where the platform does not allow it, a warning says so.
        reach: ``"127.0.0.1:PORT"`` of services on this machine (a tracking
            server, an object store) that the workers in their private network
            reach at the same address. KerasTuner's oracle
            (``KERASTUNER_ORACLE_IP``/``_PORT`` on loopback) is reached without it.
        tf_startup_logs: keep TensorFlow's C++ start-up lines (``Could not find
            cuda drivers``, ``failed call to cuInit`` on a machine without a
            GPU, ...) in the streamed output; they are dropped by default (docs:
            multi-worker/#tensorflows-start-up-lines).

    Returns:
        Worker 0's (the chief's) return value.

    Raises:
        RuntimeError: this process is itself a worker of a multi-worker job.
        ValueError: a `reach` address that is not ``HOST:PORT`` on this machine's loopback.
        mirrorkit.launcher.processes.WorkerError: a worker failed; the message
            holds its traceback, and the other workers were stopped.

    Example:
    ```python
    import mirrorkit as mk

    def train():
        import mirrorkit as mk
        strategy = mk.strategy()  # MultiWorkerMirroredStrategy, 2 workers
        return strategy.num_replicas_in_sync

    assert mk.launch(train, num_workers=2) == 2
    ```
    """
    positive_int(num_workers, "num_workers")
    here = cluster_info.from_environment()
    if here.is_multi_worker:
        raise RuntimeError(
            f"mk.launch starts its own workers, but this process is already worker "
            f"{here.worker_index} of a {here.num_workers}-worker job ({here.source}). Call "
            "mk.launch from a plain notebook or script, or call the function directly here."
        )
    results = local_job.run_job(
        fn,
        num_workers,
        args,
        pin=pin_cpus,
        private_network=private_network,
        reach=reach,
        timeout_s=timeout_s,
        tf_startup_logs=tf_startup_logs,
        wording=local_job.ARGUMENTS,
    )
    return results[0]
