"""Run benchmark configurations in fresh processes and put the results together.

Replica counts run in one process each (simulated CPU replicas, or GPUs);
worker counts run as local multi-worker jobs, each worker pinned to its own
cores, through the same machinery as ``mirrorkit launch``.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Callable, Sequence
from typing import Any

from mirrorkit.bench import measure
from mirrorkit.launcher import cluster_spec, netns, pinning, processes


def cores_for(workers: int, cores_per_worker: int | None) -> list[list[int]] | None:
    """The cores of each of `workers` workers, `cores_per_worker` each; None if too few."""
    available = pinning.available_cpus()
    if available is None:
        return None
    per = cores_per_worker or 1
    if per * workers > len(available):
        return None
    return [available[i * per : (i + 1) * per] for i in range(workers)]


def run_config(
    fn: Callable[..., Any],
    args: Sequence[Any],
    *,
    workers: int = 1,
    cores: list[list[int]] | None = None,
    timeout_s: float = 1800,
) -> list[Any]:
    """Runs ``fn(*args)`` as a job of `workers` fresh processes; returns each one's value.

    Output of the processes is kept quiet unless one fails, in which case the
    error carries its traceback.
    """
    addresses = cluster_spec.local_addresses(workers) if workers > 1 else None

    def env(i: int) -> dict[str, str]:
        extra = {"TF_CPP_MIN_LOG_LEVEL": "3"}
        if addresses:
            extra.update(cluster_spec.worker_env(addresses, i))
        return extra

    quiet = io.StringIO()
    return processes.run_function(
        fn,
        args,
        num_processes=workers,
        env=env,
        timeout_s=timeout_s,
        stream=quiet,
        cpus=cores,
        private_network=workers > 1 and netns.check() is None,
    )


def scaling(
    model: str,
    replicas: Sequence[int],
    workers: Sequence[int],
    per_replica_batch: int,
    steps: int,
    repeats: int,
    *,
    pin: bool = True,
    cores_per_worker: int | None = None,
    compression: str | None = None,
    bucket_mb: float | None = None,
    progress: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Throughput for each replica count (one worker) and each worker count (one replica each).

    Returns:
        One row per configuration: replicas, workers, examples_per_sec,
        examples_per_sec_per_replica, scaling_efficiency (against the
        single-replica, single-worker row), pinned cores.
    """
    configs = sorted({(r, 1) for r in replicas} | {(1, w) for w in workers}, key=_order)
    if workers and max(workers) > 1 and cores_per_worker is None:
        cores_per_worker = max(1, len(pinning.available_cpus() or [0]) // max(workers))
    rows = []
    for number, (r, w) in enumerate(configs, 1):
        worker_job = w > 1 or (max(workers or [1]) > 1 and r == 1)
        # The single-worker baseline of a worker sweep always gets one worker's cores,
        # so that --no-pin compares unpinned workers against the same baseline.
        cores = cores_for(w, cores_per_worker) if worker_job and (pin or w == 1) else None
        where = f", cores {pinning.describe(cores)}" if cores else ""
        progress(f"[{number}/{len(configs)}] {model}: {r} replica(s) x {w} worker(s){where} ...")
        results = run_config(
            measure.train_rate,
            (model, r, per_replica_batch, steps, repeats, False, compression, bucket_mb),
            workers=w,
            cores=cores,
        )
        chief = results[0]
        rate = chief["examples_per_sec"]
        total_replicas = chief["replicas"]
        rows.append(
            {
                "model": model,
                "replicas": total_replicas if w == 1 else 1,
                "workers": w,
                "global_batch_size": chief["global_batch_size"],
                "examples_per_sec": rate,
                "examples_per_sec_per_replica": rate / total_replicas,
                "rates": chief["rates"],
                "cores": cores,
                "pinned": cores is not None,
                "compression": compression,
                "bucket_mb": bucket_mb,
            }
        )
        progress(f"    {rate:,.1f} examples/s ({rate / total_replicas:,.1f} per replica)")
    _add_efficiency(rows)
    return rows


def _order(config: tuple[int, int]) -> tuple[int, int]:
    replicas, workers = config
    return workers, replicas


def _add_efficiency(rows: list[dict[str, Any]]) -> None:
    base = next((r for r in rows if r["replicas"] == 1 and r["workers"] == 1), None)
    for row in rows:
        row["scaling_efficiency"] = (
            row["examples_per_sec_per_replica"] / base["examples_per_sec_per_replica"]
            if base
            else None
        )


def allreduce(workers: int, repeats: int, progress: Callable[[str], None] = print) -> dict:
    """All-reduce latency and bandwidth between `workers` local workers, and memcpy bandwidth."""
    progress(f"all-reduce between {workers} workers, {len(measure.ALLREDUCE_SIZES)} sizes ...")
    times = run_config(measure.allreduce_times, (repeats,), workers=workers)[0]
    rows = []
    for row in times:
        algbw = row["bytes"] / row["seconds"]
        rows.append(
            {
                "bytes": row["bytes"],
                "latency_s": row["seconds"],
                "algbw_bytes_per_s": algbw,
                "busbw_bytes_per_s": algbw * 2 * (workers - 1) / workers,
            }
        )
    return {"workers": workers, "rows": rows, "memcpy_bytes_per_s": measure.memcpy_bandwidth()}


def compare(
    model: str, replicas: int, per_replica_batch: int, steps: int, repeats: int, what: str
) -> dict[str, Any]:
    """A/B step times in one fresh process (``raw`` vs mirrorkit, or without vs with callback)."""
    return run_config(
        measure.interleaved, (model, replicas, per_replica_batch, steps, repeats, what)
    )[0]


def stderr_progress(message: str) -> None:
    """Prints a progress line to stderr at once."""
    print(message, file=sys.stderr, flush=True)
