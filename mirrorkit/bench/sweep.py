"""Run benchmark configurations in fresh processes and put the results together.

Replica counts run in one process each (simulated CPU replicas, or GPUs);
worker counts run as local multi-worker jobs, each worker pinned to its own
cores, through the function ``mirrorkit launch`` and ``mk.launch`` use
(`mirrorkit.launcher.local_job.run_job`).
"""

from __future__ import annotations

import io
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from mirrorkit.bench import measure
from mirrorkit.cluster import tf_config
from mirrorkit.environment_variables import (
    MALLOC_PREFIX,
    MIRRORKIT_PREFIX,
    OMP_NUM_THREADS,
    TF_CONFIG,
    TF_CPP_MIN_LOG_LEVEL,
    TF_NUM_INTEROP_THREADS,
    TF_NUM_INTRAOP_THREADS,
)
from mirrorkit.launcher import local_job, pinning, plain_processes
from mirrorkit.launcher.ports import local_addresses


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
    return local_job.run_job(
        fn,
        workers,
        args,
        pin=cores or False,
        private_network=workers > 1,
        env=lambda i: {TF_CPP_MIN_LOG_LEVEL: "3"},
        timeout_s=timeout_s,
        stream=io.StringIO(),  # quiet; a failure's error carries its traceback
        wording=None,
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
    rounds: int = 1,
    step_logs: str = "averaged",
    raw: bool = False,
    progress: Callable[[str], None] = print,
    data: Any = None,
) -> list[dict[str, Any]]:
    """Throughput for each replica count (one worker) and each worker count (one replica each).

    With `rounds` > 1 every configuration runs that many times, one round of
    all configurations after another, so that each ratio compares runs made
    minutes apart rather than a whole sweep apart.

    Returns:
        One row per configuration: replicas, workers, examples_per_sec (the
        median over rounds), examples_per_sec_per_replica, scaling_efficiency
        (against the single-replica, single-worker row: the median of the
        rounds' ratios), efficiency_per_round, pinned cores.
    """
    configs = sorted({(r, 1) for r in replicas} | {(1, w) for w in workers}, key=_order)
    label = model if isinstance(model, str) else getattr(model, "__name__", "your model")
    if workers and max(workers) > 1 and cores_per_worker is None:
        cores_per_worker = max(1, len(pinning.available_cpus() or [0]) // max(workers))
    runs: dict[tuple[int, int], list[dict[str, Any]]] = {config: [] for config in configs}
    raw_counts = sorted(set(workers) | {1}) if raw and max(workers or [1]) > 1 else []
    raw_runs: dict[int, list[dict[str, Any]]] = {w: [] for w in raw_counts}
    for round_ in range(1, rounds + 1):
        for number, (r, w) in enumerate(configs, 1):
            worker_job = w > 1 or (max(workers or [1]) > 1 and r == 1)
            # The single-worker baseline of a worker sweep always gets one worker's cores,
            # so that --no-pin compares unpinned workers against the same baseline.
            cores = cores_for(w, cores_per_worker) if worker_job and (pin or w == 1) else None
            where = f", cores {pinning.describe(cores)}" if cores else ""
            of_rounds = f" (round {round_}/{rounds})" if rounds > 1 else ""
            progress(
                f"[{number}/{len(configs)}] {label}: {r} replica(s) x {w} worker(s){where}"
                f"{of_rounds} ..."
            )
            args = (model, r, per_replica_batch, steps, repeats, False, compression, bucket_mb)
            chief = run_config(
                measure.train_rate, (*args, step_logs, data), workers=w, cores=cores
            )[0]
            chief["cores"] = cores
            runs[(r, w)].append(chief)
            per_replica = chief["examples_per_sec"] / chief["replicas"]
            progress(
                f"    {chief['examples_per_sec']:,.1f} examples/s ({per_replica:,.1f} per replica)"
            )
        for w in raw_counts:
            progress(f"[raw] {model}: {w} worker(s), TF_CONFIG by hand, unpinned{of_rounds} ...")
            chief = raw_job(model, w, per_replica_batch, steps, repeats)
            chief["cores"] = None
            raw_runs[w].append(chief)
            progress(f"    {chief['examples_per_sec']:,.1f} examples/s (raw)")
    rows = [_row(model, w, runs[(r, w)], compression, bucket_mb, step_logs) for r, w in configs]
    _add_efficiency(rows)
    raw_rows = [_row(model, w, raw_runs[w], None, None, "local") for w in raw_counts]
    for row in raw_rows:
        row["launcher"] = "raw"
        row["affinity"] = raw_runs[row["workers"]][0]["affinity"]
        row["intra_op_threads"] = raw_runs[row["workers"]][0]["intra_op_threads"]
        row["env"] = raw_runs[row["workers"]][0]["env"]
    _add_efficiency(raw_rows)
    return rows + raw_rows


def _row(model, workers, runs, compression, bucket_mb, step_logs) -> dict[str, Any]:
    """One configuration's row: medians over its rounds."""
    total_replicas = runs[0]["replicas"]
    per_round = [run["examples_per_sec"] for run in runs]
    rate = statistics.median(per_round)
    return {
        "model": model if isinstance(model, str) else getattr(model, "__name__", repr(model)),
        "replicas": total_replicas if workers == 1 else 1,
        "workers": workers,
        "global_batch_size": runs[0]["global_batch_size"],
        "examples_per_sec": rate,
        "examples_per_sec_per_replica": rate / total_replicas,
        "examples_per_sec_per_round": per_round,
        "rates": [r for run in runs for r in run["rates"]],
        "cores": runs[0]["cores"],
        "pinned": runs[0]["cores"] is not None,
        "compression": compression,
        "bucket_mb": bucket_mb,
        "step_logs": step_logs,
        "launcher": "mirrorkit",
        "verdict": runs[-1].get("verdict"),
        "compute_share": runs[-1].get("compute_share"),
        "communication_share": runs[-1].get("communication_share"),
    }


def _order(config: tuple[int, int]) -> tuple[int, int]:
    replicas, workers = config
    return workers, replicas


def _add_efficiency(rows: list[dict[str, Any]]) -> None:
    """Each row's efficiency in every round against that round's baseline, and their median."""
    base = next((r for r in rows if r["replicas"] == 1 and r["workers"] == 1), None)
    for row in rows:
        if base is None:
            row["scaling_efficiency"], row["efficiency_per_round"] = None, None
            continue
        replicas = row["examples_per_sec"] / row["examples_per_sec_per_replica"]
        row["efficiency_per_round"] = [
            rate / replicas / base_rate
            for rate, base_rate in zip(
                row["examples_per_sec_per_round"], base["examples_per_sec_per_round"], strict=True
            )
        ]
        row["scaling_efficiency"] = statistics.median(row["efficiency_per_round"])


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


#: Settings mirrorkit's launcher plans; the raw job's workers get none of them.
_MIRRORKIT_ENV = (
    MALLOC_PREFIX,
    TF_NUM_INTRAOP_THREADS,
    TF_NUM_INTEROP_THREADS,
    OMP_NUM_THREADS,
    MIRRORKIT_PREFIX,
)


def raw_job(
    model: str, workers: int, per_replica_batch: int, steps: int, repeats: int,
    timeout_s: float = 1800,
) -> dict[str, Any]:  # fmt: skip
    """Runs `workers` workers the way TensorFlow's multi-worker tutorial does; the chief's result.

    TF_CONFIG is the tutorial's (workers on free loopback ports), the workers are plain
    ``python`` processes with this process's CPUs and TensorFlow's default
    threads, and `measure.raw_worker_main` trains (see `measure.RAW_WORKERS_HOW`).
    """
    addresses = local_addresses(workers)
    base = {k: v for k, v in os.environ.items() if not k.startswith(_MIRRORKIT_ENV)}
    base.pop(TF_CONFIG, None)
    code = "from mirrorkit.bench.measure import raw_worker_main; raw_worker_main()"
    with tempfile.TemporaryDirectory() as tmp:
        outs = [os.path.join(tmp, f"worker-{i}.json") for i in range(workers)]
        argvs, envs = [], []
        for i in range(workers):
            env = dict(base, TF_CPP_MIN_LOG_LEVEL="3")
            env[TF_CONFIG] = tf_config.tf_config(addresses, i)
            argv = [sys.executable, "-c", code, outs[i], model]
            argv += [str(per_replica_batch), str(steps), str(repeats)]
            argvs.append(argv)
            envs.append(env)
        plain_processes.run_plain_workers(argvs, envs, timeout_s)
        with open(outs[0]) as f:
            return json.load(f)


def stderr_progress(message: str) -> None:
    """Prints a progress line to stderr at once."""
    print(message, file=sys.stderr, flush=True)
