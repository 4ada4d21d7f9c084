"""`mk.strategy()`: the one entry point that turns a request into a strategy.

It checks the request (`mirrorkit.strategies.arguments`), resolves ``auto``
(`mirrorkit.strategies.topology.plan_auto`), fixes the devices (`mirrorkit.strategies.devices`),
calls the kind's builder (`mirrorkit.strategies.kinds`), applies the Keras repairs the
strategy needs (`mirrorkit.compat`) and records it as the current strategy
(`mirrorkit.strategies.current`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import tensorflow as tf

from mirrorkit import compat
from mirrorkit.cluster import chief, legacy_keras, platforms
from mirrorkit.environment_variables import TF_CONFIG
from mirrorkit.strategies import (
    allreduce,
    arguments,
    current,
    kinds,
    peer_wait,
    tf_logging,
    topology,
)
from mirrorkit.strategies import devices as devices_lib
from mirrorkit.strategies.current import current_strategy

__all__ = ["current_strategy", "strategy"]


def strategy(
    kind: str = "auto",
    *,
    devices: Sequence[str] | None = None,
    num_gpus: int | None = None,
    cpu_replicas: int | None = None,
    all_reduce: str = "auto",
    bucket_mb: float | None = None,
    timeout_s: float | None = None,
    startup_timeout_s: float | None = 600.0,  # peer_wait.DEFAULT_TIMEOUT_S (test_startup)
) -> tf.distribute.Strategy:
    """Makes the `tf.distribute.Strategy` for this machine or cluster.

    ``kind="auto"`` chooses, first match wins:

    1. ``TF_CONFIG`` naming more than one training task, or a Slurm step with
       more than one task: `tf.distribute.MultiWorkerMirroredStrategy`.
    2. Two or more GPUs: `tf.distribute.MirroredStrategy` over them.
    3. ``cpu_replicas=N`` (N >= 2): `MirroredStrategy` over N logical CPU
       devices, real replicas on a laptop, in a notebook or in tests.
    4. Otherwise `tf.distribute.OneDeviceStrategy` (GPU:0, else CPU:0).

    Calling it again with the same request returns the same strategy, so a
    notebook cell can run twice. It prints one line on the chief when it makes
    a strategy.

    Args:
        kind: ``auto``, ``mirrored``, ``multi_worker`` (alias
            ``multi_worker_mirrored``), ``one_device`` or ``default`` (alias
            ``off``: TensorFlow's default, no distribution); case-insensitive.
        devices: explicit replica devices for ``mirrored`` or ``one_device``,
            e.g. ``["GPU:0", "GPU:2"]``.
        num_gpus: use the first N GPUs.
        cpu_replicas: split the CPU into N logical devices, one replica each.
            Must come before anything else initialises TensorFlow's devices;
            after that, N up to the number of logical CPUs already fixed is
            served from those (said once), and a larger N is an error.
        all_reduce: ``auto``, ``nccl``, ``ring``, ``hierarchical_copy`` or
            ``reduce_to_one``; docs: keras-code/#all-reduce-choices.
        bucket_mb: pack gradients into all-reduce buckets of this many MB.
        timeout_s: abort a collective that waits longer than this (the
            collective all-reduce only; a warning where TensorFlow has none).
        startup_timeout_s: how long a multi-worker strategy waits for its
            peers to start (default 600 s; None: no limit). Meanwhile the chief
            says every few seconds which tasks are not up yet; after it, or on
            Ctrl-C/SIGTERM, the process ends (exit status 137) with a message
            naming the missing tasks (docs:
            failures/#a-worker-never-starts-typo-in-a-host-name-a-pod-that-never-scheduled).

    Returns:
        A `tf.distribute.Strategy`: TensorFlow's own object, no wrapper.

    Raises:
        ValueError: an unknown kind or all-reduce, contradictory arguments,
            more GPUs than exist, a device that does not exist, a malformed
            TF_CONFIG, or a GPU-only all-reduce without GPUs.
        RuntimeError: a request that conflicts with devices TensorFlow has
            already fixed in this process.

    Example:
    ```python
    import keras
    import mirrorkit as mk

    strategy = mk.strategy(cpu_replicas=2)  # MirroredStrategy, 2 replicas
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    ```
    """
    name = arguments.normalize_kind(kind)
    arguments.check_backend()
    legacy_keras.say_keras_3()  # Ray Train sets TF_USE_LEGACY_KERAS=1; mirrorkit keeps Keras 3
    platforms.say_notices()  # SageMaker hosts without TF_CONFIG train alone
    arguments.check_arguments(name, devices, num_gpus, cpu_replicas, bucket_mb, timeout_s)
    startup_timeout_s = peer_wait.check_timeout(startup_timeout_s)
    all_reduce = allreduce.normalize(all_reduce)
    devices = tuple(devices_lib.short_device(d) for d in devices) if devices else None
    resolved = _resolve_auto(devices, num_gpus, cpu_replicas) if name == "auto" else name
    if name == "auto" and resolved in ("one_device", "default"):
        allreduce.require_gpus(all_reduce, has_gpus=bool(tf.config.list_physical_devices("GPU")))
        arguments.warn_unused_all_reduce(all_reduce, bucket_mb, timeout_s)
        all_reduce, bucket_mb, timeout_s = "auto", None, None
    elif resolved in ("one_device", "default"):
        arguments.refuse_all_reduce_options(resolved, all_reduce, bucket_mb, timeout_s)

    key = (
        resolved,
        devices,
        num_gpus,
        cpu_replicas,
        all_reduce,
        bucket_mb,
        timeout_s,
        os.environ.get(TF_CONFIG, ""),
    )
    made = current.lookup(key)
    if made is not None:
        compat.enable(made)  # idempotent; back in place after a compat.disable()
        return made
    if cpu_replicas is not None:
        devices_lib.ensure_cpu_replicas(cpu_replicas)
    tf_logging.quiet_interactive_info()  # no INFO:tensorflow lines in a notebook's fit
    with peer_wait.watch(startup_timeout_s if resolved == "multi_worker" else None):
        made = kinds.BUILDERS[resolved](
            devices=devices,
            num_gpus=num_gpus,
            cpu_replicas=cpu_replicas,
            all_reduce=all_reduce,
            bucket_mb=bucket_mb,
            timeout_s=timeout_s,
        )
    current.remember(key, made)
    compat.enable(made)
    chief.say(topology.describe(made).summary())
    return made


def _resolve_auto(devices, num_gpus, cpu_replicas) -> str:
    if devices is not None:
        return "mirrored" if len(devices) > 1 else "one_device"
    return topology.plan_auto(cpu_replicas=cpu_replicas, num_gpus=num_gpus).kind
