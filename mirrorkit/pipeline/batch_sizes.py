"""Global and per-replica batch sizes: exactly one is given, the other follows."""

from __future__ import annotations

import dataclasses

from mirrorkit.number_checks import positive_int


@dataclasses.dataclass(frozen=True)
class BatchSizes:
    """The batch sizes of one distributed input.

    Attributes:
        global_batch_size: examples per step over all replicas and workers.
        per_replica_batch_size: examples per step on each replica.
        num_replicas: replicas in sync.
    """

    global_batch_size: int
    per_replica_batch_size: int
    num_replicas: int


def resolve(
    num_replicas: int, per_replica_batch_size: int | None, global_batch_size: int | None
) -> BatchSizes:
    """Derives both batch sizes from the one given.

    Args:
        num_replicas: the strategy's ``num_replicas_in_sync``.
        per_replica_batch_size: examples per replica per step, or None.
        global_batch_size: examples per step over all replicas, or None.

    Raises:
        ValueError: both or neither given, a size below 1, or a global size
            that `num_replicas` does not divide (the message names the
            nearest sizes that work).

    Example:
    ```python
    from mirrorkit.pipeline.batch_sizes import resolve

    assert resolve(4, None, 64).per_replica_batch_size == 16
    assert resolve(4, 16, None).global_batch_size == 64
    ```
    """
    if (per_replica_batch_size is None) == (global_batch_size is None):
        given = "both" if per_replica_batch_size is not None else "neither"
        raise ValueError(
            "Give exactly one of per_replica_batch_size= and global_batch_size= "
            f"(got {given}); the other follows from the {num_replicas} replicas in sync."
        )
    per_replica_batch_size = positive_int(
        per_replica_batch_size, "per_replica_batch_size", or_none=True, what="a positive integer"
    )
    global_batch_size = positive_int(
        global_batch_size, "global_batch_size", or_none=True, what="a positive integer"
    )
    if per_replica_batch_size is not None:
        return BatchSizes(
            per_replica_batch_size * num_replicas, per_replica_batch_size, num_replicas
        )
    if global_batch_size % num_replicas:
        below = max(num_replicas, global_batch_size // num_replicas * num_replicas)
        above = (global_batch_size // num_replicas + 1) * num_replicas
        raise ValueError(
            f"global_batch_size={global_batch_size} does not divide among {num_replicas} "
            f"replicas; the nearest sizes that do are {below} and {above} "
            f"(or pass per_replica_batch_size=)."
        )
    return BatchSizes(global_batch_size, global_batch_size // num_replicas, num_replicas)
