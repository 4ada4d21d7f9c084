"""`ThroughputCallback`'s TensorBoard scalars: the epoch's figures, and one set per replica."""

from __future__ import annotations

import tensorflow as tf

from mirrorkit.throughput.report import EpochThroughput


def write(writer, figures: EpochThroughput) -> None:
    """Writes one epoch's figures as scalars (``throughput/...``, one per replica too) and flushes.

    Args:
        writer: a ``tf.summary`` file writer (the chief's).
        figures: the epoch's figures.
    """
    with writer.as_default():
        for key in (
            "examples_per_sec",
            "examples_per_sec_per_replica",
            "epoch_examples_per_sec",
            "step_time_median_s",
            "step_time_p90_s",
            "scaling_efficiency",
            "spread",
            "replica_spread",
            "compute_share",
            "communication_share",
            "update_share",
            "replica_wait_share",
            "dispatch_share",
            "input_wait_share",
            "host_share",
        ):
            value = getattr(figures, key)
            if value is not None:
                tf.summary.scalar(f"throughput/{key}", value, step=figures.epoch)
        for key, name in (
            ("replica_compute_median_s", "compute_s"),
            ("replica_all_reduce_median_s", "all_reduce_s"),
            ("replica_examples_per_sec", "examples_per_sec"),
        ):  # one scalar a replica: a slow GPU stands out in the dashboard
            for replica, value in enumerate(getattr(figures, key)):
                tf.summary.scalar(f"throughput/replica_{replica}/{name}", value, step=figures.epoch)
    writer.flush()


def require_tensorboard() -> None:
    """Raises ImportError, saying what to install, when the tensorboard package is missing."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        raise ImportError(
            "ThroughputCallback(tensorboard_dir=...) writes TensorBoard scalars, which needs the "
            "tensorboard package: pip install tensorboard (or mirrorkit[tensorboard])."
        ) from None
