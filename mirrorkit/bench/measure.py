"""Measurements that run inside one benchmark process (or each worker of one).

Each function builds its strategy first (so it runs in a fresh process) and
returns plain numbers; `mirrorkit.bench.sweep` starts the processes.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import keras
import numpy as np

from mirrorkit.cluster import cluster_info

#: All-reduce message sizes in bytes: 4 KB to 64 MB, by factors of 4.
ALLREDUCE_SIZES = tuple(4096 * 4**i for i in range(8))


class EpochClock(keras.callbacks.Callback):
    """A Keras callback that records each epoch's wall time and nothing else."""

    def __init__(self):
        super().__init__()
        self.epoch_times: list[float] = []

    def on_epoch_begin(self, epoch, logs=None):
        """Starts the clock."""
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        """Records the epoch's wall time."""
        self.epoch_times.append(time.perf_counter() - self._start)


def _strategy(replicas: int, raw: bool, bucket_mb: float | None = None):
    import tensorflow as tf

    import mirrorkit as mk

    # A one-worker job's TF_CONFIG (the sweep's launcher writes one) names no peers.
    multi_worker = cluster_info.from_environment().is_multi_worker
    if raw:
        if multi_worker:
            return tf.distribute.MultiWorkerMirroredStrategy()
        cpu = tf.config.list_physical_devices("CPU")[0]
        gpus = tf.config.list_physical_devices("GPU")
        if not gpus and replicas > 1:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration()] * replicas
            )
        kind = "GPU" if gpus else "CPU"
        return tf.distribute.MirroredStrategy([f"/{kind}:{i}" for i in range(replicas)])
    if multi_worker:
        return mk.strategy(bucket_mb=bucket_mb)
    if _has_gpus():
        return mk.strategy(num_gpus=replicas, bucket_mb=bucket_mb)
    if replicas == 1:
        return mk.strategy("one_device")
    return mk.strategy(cpu_replicas=replicas, bucket_mb=bucket_mb)


def _has_gpus() -> bool:
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))


def _model_and_data(
    name, strategy, per_replica_batch, raw, compression=None, step_logs="averaged", data=None
):
    import tensorflow as tf

    import mirrorkit as mk
    from mirrorkit.bench import models, user_model

    if user_model.is_spec(name):  # a model of yours: module:function, or the function itself
        make_model = user_model.load(name) if isinstance(name, str) else name
        make_data = user_model.load(data, "--data") if isinstance(data, str) else data
        model = user_model.build(
            make_model, strategy, gradient_compression=compression, step_logs=step_logs
        )
        one_each = user_model.examples(model, make_data)
        examples = mk.distribute(
            lambda context=None: one_each.repeat(),
            strategy,
            per_replica_batch_size=per_replica_batch,
        )
        return model, examples
    spec = models.get(name)
    example = models.synthetic_example(spec)

    def examples(context=None):
        return tf.data.Dataset.from_tensors(example).repeat()

    if raw:
        with strategy.scope():
            model = models.compiled(spec)
        data = strategy.distribute_datasets_from_function(
            lambda context: examples().batch(per_replica_batch, drop_remainder=True).prefetch(2)
        )
        return model, data
    model = mk.build(
        lambda: models.compiled(spec),
        strategy,
        gradient_compression=compression,
        step_logs=step_logs,
    )
    data = mk.distribute(examples, strategy, per_replica_batch_size=per_replica_batch)
    return model, data


def train_rate(
    model_name: str,
    replicas: int,
    per_replica_batch: int,
    steps: int,
    repeats: int,
    raw: bool = False,
    compression: str | None = None,
    bucket_mb: float | None = None,
    step_logs: str = "averaged",
    data: Any = None,
) -> dict[str, Any]:
    """Trains `repeats` timed epochs of `steps` steps after one warm-up epoch.

    `model_name` is a bundled model's name, ``module:function`` or a function returning a
    compiled model (`mirrorkit.bench.user_model`); `data` its examples' function, if any.

    Returns:
        ``examples_per_sec`` (global, median over repeats), the per-repeat
        rates, the replica and worker counts, and the last epoch's throughput
        verdict and shares (`ThroughputCallback`).
    """
    import mirrorkit as mk

    strategy = _strategy(replicas, raw, bucket_mb)
    model, data = _model_and_data(
        model_name, strategy, per_replica_batch, raw, compression, step_logs, data
    )
    clock = EpochClock()
    throughput = mk.ThroughputCallback(verbose=0, warmup_steps=min(5, steps - 1))
    callbacks = [clock] if raw else [clock, throughput]
    model.fit(data, epochs=repeats + 1, steps_per_epoch=steps, verbose=0, callbacks=callbacks)
    global_batch = per_replica_batch * strategy.num_replicas_in_sync
    rates = [global_batch * steps / t for t in clock.epoch_times[1:]]
    last = throughput.report.epochs[-1] if throughput.report.epochs else None
    return {
        "examples_per_sec": statistics.median(rates),
        "rates": rates,
        "replicas": strategy.num_replicas_in_sync,
        "global_batch_size": global_batch,
        "verdict": last.verdict if last else None,
        "compute_share": last.compute_share if last else None,
        "communication_share": last.communication_share if last else None,
    }


def interleaved(
    model_name: str,
    replicas: int,
    per_replica_batch: int,
    steps: int,
    repeats: int,
    compare: str,
) -> dict[str, Any]:
    """A/B step times in one process, alternating epochs: ``raw`` or ``callback`` vs mirrorkit.

    With ``compare="raw"``, A is hand-written tf.distribute + Keras code and B
    the same model through mirrorkit (mk.strategy, mk.build, mk.distribute,
    ThroughputCallback). With ``compare="callback"``, A is mirrorkit without
    and B with a `ThroughputCallback`.
    """
    import mirrorkit as mk

    if compare == "raw":
        raw_strategy = _strategy(replicas, raw=True)
        a = _model_and_data(model_name, raw_strategy, per_replica_batch, raw=True)
        b = _model_and_data(model_name, _strategy(replicas, raw=False), per_replica_batch, False)
        callbacks_a, callbacks_b = [], [mk.ThroughputCallback(verbose=0)]
    elif compare == "callback":
        a = b = _model_and_data(model_name, _strategy(replicas, False), per_replica_batch, False)
        callbacks_a, callbacks_b = [], [mk.ThroughputCallback(verbose=0)]
    else:
        raise ValueError(f"compare must be 'raw' or 'callback'; got {compare!r}")
    times: dict[str, list[float]] = {"a": [], "b": []}
    for round_ in range(repeats + 1):
        for key, (model, data), extra in (("a", a, callbacks_a), ("b", b, callbacks_b)):
            clock = EpochClock()
            model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[clock, *extra])
            if round_ > 0:  # round 0 traces and warms up both
                times[key].append(clock.epoch_times[0] / steps)
    median_a, median_b = statistics.median(times["a"]), statistics.median(times["b"])
    return {
        "compare": compare,
        "step_time_a_s": median_a,
        "step_time_b_s": median_b,
        "ratio_b_over_a": median_b / median_a,
        "times": times,
    }


def allreduce_times(repeats: int, sizes: tuple[int, ...] = ALLREDUCE_SIZES) -> list[dict]:
    """Median all-reduce time of float32 tensors of each size across this job's workers."""
    import tensorflow as tf

    import mirrorkit as mk

    strategy = mk.strategy()
    rows = []
    for size in sizes:

        @tf.function
        def reduce_once(elements=size // 4):
            def replica_fn():
                context = tf.distribute.get_replica_context()
                tensor = tf.ones([elements], tf.float32)
                return tf.reduce_sum(context.all_reduce(tf.distribute.ReduceOp.SUM, tensor)[:1])

            return strategy.experimental_local_results(strategy.run(replica_fn))[0]

        reduce_once().numpy()  # trace and warm up
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            reduce_once().numpy()
            times.append(time.perf_counter() - start)
        rows.append({"bytes": size, "seconds": statistics.median(times)})
    return rows


def memcpy_bandwidth(size: int = 64 * 2**20, repeats: int = 10) -> float:
    """This machine's memory copy bandwidth in bytes/s (NumPy copy of `size` bytes)."""
    source = np.ones(size, np.uint8)
    target = np.empty_like(source)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(target, source)
        times.append(time.perf_counter() - start)
    return size / statistics.median(times)


#: How `mirrorkit bench --compare-raw` writes the raw multi-worker job (said in its output).
RAW_WORKERS_HOW = (
    "raw: TF_CONFIG written by hand, default TensorFlow threads, no CPU pinning, no allocator "
    "settings, plain tf.distribute.MultiWorkerMirroredStrategy + Keras fit on "
    "experimental_distribute_dataset; of mirrorkit only mirrorkit.compat.enable() (plain "
    "Keras 3 fails under MultiWorkerMirroredStrategy without it, docs: compat/)"
)


def raw_worker_main() -> None:
    """One worker of the raw multi-worker job, as TensorFlow's tutorial writes it.

    Reads its TF_CONFIG from the environment (written by hand by the caller)
    and ``out_path model per_replica_batch steps repeats`` from `sys.argv`;
    writes its rate, CPU affinity and thread settings as JSON to `out_path`.
    Nothing of mirrorkit runs but `mirrorkit.compat.enable`.
    """
    import json
    import os
    import sys

    import tensorflow as tf

    from mirrorkit import compat
    from mirrorkit.bench import models

    out_path, name = sys.argv[1], sys.argv[2]
    per_replica_batch, steps, repeats = (int(v) for v in sys.argv[3:6])
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    compat.enable(strategy)
    spec = models.get(name)
    global_batch = per_replica_batch * strategy.num_replicas_in_sync
    dataset = tf.data.Dataset.from_tensors(models.synthetic_example(spec)).repeat()
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = dataset.batch(global_batch, drop_remainder=True).with_options(options)
    with strategy.scope():
        model = models.compiled(spec)
    data = strategy.experimental_distribute_dataset(dataset)
    clock = EpochClock()
    model.fit(data, epochs=repeats + 1, steps_per_epoch=steps, verbose=0, callbacks=[clock])
    rates = [global_batch * steps / t for t in clock.epoch_times[1:]]
    result = {
        "examples_per_sec": statistics.median(rates),
        "rates": rates,
        "replicas": strategy.num_replicas_in_sync,
        "global_batch_size": global_batch,
        "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
        "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
        "env": {
            k: v for k, v in os.environ.items() if k.startswith(("MALLOC_", "TF_NUM_", "OMP_"))
        },
    }
    with open(out_path, "w") as f:
        json.dump(result, f)
