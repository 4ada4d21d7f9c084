"""All-reduce choices: names mapped to TensorFlow's cross-device ops in one place.

`all_reduce` names what averages the gradients:

| name | MirroredStrategy (one host) | MultiWorkerMirroredStrategy |
| --- | --- | --- |
| ``auto`` | collective all-reduce: NCCL on GPUs, ring on CPUs | implementation ``AUTO`` |
| ``ring`` | the collective all-reduce, ring implementation | ``RING`` |
| ``nccl`` | `tf.distribute.NcclAllReduce` (GPUs only) | ``NCCL`` (GPUs only) |
| ``hierarchical_copy`` | `tf.distribute.HierarchicalCopyAllReduce` (GPUs only) | not offered |
| ``reduce_to_one`` | `tf.distribute.ReductionToOneDevice` | not offered |

`bucket_mb` packs gradients into buckets of that many megabytes so that
all-reduce starts before the whole backward pass ends (``bytes_per_pack``);
`timeout_s` aborts a collective that waits longer than that. Both apply to the
collective all-reduce (``auto``, ``ring``, ``nccl`` across workers); the
single-host NCCL and hierarchical-copy ops pack into one buffer and have no
timeout.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from mirrorkit import internals
from mirrorkit.strategies import rules

ALL_REDUCE_CHOICES = rules.ALL_REDUCE_CHOICES
_MULTI_WORKER_CHOICES = rules.MULTI_WORKER_CHOICES


@dataclasses.dataclass(frozen=True)
class AllReducePlan:
    """What to pass to a strategy's constructor, and what to set after.

    Attributes:
        cross_device_ops: for MirroredStrategy; None keeps TensorFlow's collective.
        options: `tf.distribute.experimental.CommunicationOptions` for the
            collective all-reduce, or None to keep TensorFlow's defaults.
    """

    cross_device_ops: tf.distribute.CrossDeviceOps | None
    options: tf.distribute.experimental.CommunicationOptions | None


def normalize(all_reduce: str) -> str:
    """Returns the canonical all-reduce name, or raises naming the valid ones."""
    if not isinstance(all_reduce, str) or all_reduce.lower() not in ALL_REDUCE_CHOICES:
        raise ValueError(
            f"Unknown all_reduce {all_reduce!r}; valid values are {', '.join(ALL_REDUCE_CHOICES)}"
        )
    return all_reduce.lower()


def _options(
    implementation: str, bucket_mb: float | None, timeout_s: float | None
) -> tf.distribute.experimental.CommunicationOptions | None:
    if implementation == "auto" and bucket_mb is None and timeout_s is None:
        return None
    impl = tf.distribute.experimental.CommunicationImplementation
    return tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=0 if bucket_mb is None else int(bucket_mb * 1024 * 1024),
        timeout_seconds=timeout_s,
        implementation={"auto": impl.AUTO, "ring": impl.RING, "nccl": impl.NCCL}[implementation],
    )


def require_gpus(all_reduce: str, *, has_gpus: bool) -> None:
    """Raises when `all_reduce` is a GPU-only op and this process has no GPU.

    `mk.strategy()` calls it where ``kind='auto'`` chose one device, which
    would otherwise drop the all-reduce choice with a warning: asking for a
    GPU-only op on a machine without GPUs is a mistake, not a preference.

    Args:
        all_reduce: a name from `ALL_REDUCE_CHOICES`.
        has_gpus: whether this process sees any GPU.
    """
    if all_reduce in rules.GPU_ONLY and not has_gpus:
        raise ValueError(
            f"all_reduce={all_reduce!r} needs GPUs, and this process sees none (so kind='auto' "
            "would run on one CPU device). Use all_reduce='auto' (TensorFlow's ring all-reduce on "
            "CPUs), cpu_replicas=N for several CPU replicas, or check CUDA_VISIBLE_DEVICES and "
            "`mirrorkit info`."
        )


def plan_mirrored(
    all_reduce: str, *, on_gpus: bool, bucket_mb: float | None, timeout_s: float | None
) -> AllReducePlan:
    """Plans the all-reduce of a single-host MirroredStrategy.

    Args:
        all_reduce: a name from `ALL_REDUCE_CHOICES`.
        on_gpus: whether every replica is a GPU.
        bucket_mb: gradient bucket size in megabytes, or None.
        timeout_s: collective timeout in seconds, or None.

    Returns:
        An `AllReducePlan`.

    Raises:
        ValueError: for a GPU-only op without GPUs, or options the op ignores.
    """
    name = normalize(all_reduce)
    if name in rules.GPU_ONLY and not on_gpus:
        raise ValueError(
            f"all_reduce={name!r} needs GPUs, and these replicas are CPUs. Use all_reduce='auto' "
            "(TensorFlow's ring all-reduce on CPUs) or 'reduce_to_one'."
        )
    if rules.collective(name, multi_worker=False):
        implementation = "ring" if name == "ring" else "auto"
        return AllReducePlan(None, _options(implementation, bucket_mb, timeout_s))
    if bucket_mb is not None or timeout_s is not None:
        given = "bucket_mb" if bucket_mb is not None else "timeout_s"
        raise ValueError(
            f"{given} applies to the collective all-reduce (all_reduce='auto' or 'ring'); "
            f"all_reduce={name!r} packs every gradient into one buffer and has no timeout. "
            f"Drop {given}, or use all_reduce='auto'."
        )
    if name == "nccl":
        return AllReducePlan(tf.distribute.NcclAllReduce(), None)
    if name == "hierarchical_copy":
        return AllReducePlan(tf.distribute.HierarchicalCopyAllReduce(), None)
    return AllReducePlan(tf.distribute.ReductionToOneDevice(), None)


def plan_multi_worker(
    all_reduce: str, *, has_gpus: bool, bucket_mb: float | None, timeout_s: float | None
) -> tf.distribute.experimental.CommunicationOptions:
    """Plans the CommunicationOptions of a MultiWorkerMirroredStrategy.

    Args:
        all_reduce: ``auto``, ``ring`` or ``nccl``.
        has_gpus: whether this worker has GPUs.
        bucket_mb: gradient bucket size in megabytes, or None.
        timeout_s: collective timeout in seconds, or None.

    Returns:
        `tf.distribute.experimental.CommunicationOptions`.
    """
    name = normalize(all_reduce)
    if name not in _MULTI_WORKER_CHOICES:
        raise ValueError(
            f"all_reduce={name!r} is a single-host op; a multi-worker strategy takes "
            f"{', '.join(_MULTI_WORKER_CHOICES)}"
        )
    if name == "nccl" and not has_gpus:
        raise ValueError(
            "all_reduce='nccl' needs GPUs, and this worker has none. Use all_reduce='auto' "
            "(ring all-reduce over gRPC on CPUs)."
        )
    options = _options(name, bucket_mb, timeout_s)
    return options or tf.distribute.experimental.CommunicationOptions()


def describe_ops(strategy: tf.distribute.Strategy) -> str:
    """Names the all-reduce a strategy uses, e.g. ``CollectiveAllReduce (RING)``.

    A MirroredStrategy's or MultiWorkerMirroredStrategy's all-reduce is read from
    two private fields of its ``extended``; without them (a TensorFlow outside the
    tested range) the description is ``unknown``, with an `InternalChangedWarning`.
    Other strategies have no all-reduce to read.
    """
    if not isinstance(
        strategy, (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy)
    ):
        return "none (one replica)" if strategy.num_replicas_in_sync == 1 else "unknown"
    extended = strategy.extended
    used_for = "the all-reduce in mk.strategy's description, which says 'unknown' without it"
    options = internals.optional(
        extended,
        "_communication_options",
        name="MirroredStrategy.extended._communication_options",
        used_for=used_for,
    )
    implementation = getattr(getattr(options, "implementation", None), "name", None)
    ops = internals.optional(
        extended,
        "_cross_device_ops",
        name="MirroredStrategy.extended._cross_device_ops",
        used_for=used_for,
    )
    if ops is None and implementation is None:
        return "none (one replica)" if strategy.num_replicas_in_sync == 1 else "unknown"
    if ops is None or type(ops).__name__ == "CollectiveAllReduce":
        text = f"CollectiveAllReduce ({implementation or 'AUTO'})"
    else:
        text = type(ops).__name__
    pack = getattr(options, "bytes_per_pack", 0)
    if pack:
        text += f", buckets of {pack / 2**20:g} MB"
    timeout = getattr(options, "timeout_seconds", None)
    if timeout:
        text += f", timeout {timeout:g} s"
    return text
