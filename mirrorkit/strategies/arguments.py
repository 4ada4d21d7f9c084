"""What `mk.strategy()` accepts: the kinds, their aliases, and the argument checks.

The strings users pass are mapped to strategy kinds in this one place; every
error names the accepted values or the argument that contradicts another.
Nothing here touches TensorFlow's devices.
"""

from __future__ import annotations

from collections.abc import Sequence

import keras

from mirrorkit.cluster import chief
from mirrorkit.number_checks import positive_number
from mirrorkit.strategies import rules

#: The kinds, their aliases and `normalize_kind` live in `rules` (shared with the flags).
KINDS, ALIASES, normalize_kind = rules.KINDS, rules.ALIASES, rules.normalize_kind


def check_backend() -> None:
    """Raises unless Keras runs on the TensorFlow backend, saying how to set it."""
    backend = keras.backend.backend()
    if backend != "tensorflow":
        raise RuntimeError(
            f"Keras runs on the {backend!r} backend here; mirrorkit needs 'tensorflow'. Set "
            "KERAS_BACKEND=tensorflow before Python starts (or before keras is first imported)."
        )


def check_arguments(
    name: str,
    devices: Sequence[str] | None,
    num_gpus: int | None,
    cpu_replicas: int | None,
    bucket_mb: float | None,
    timeout_s: float | None,
) -> None:
    """Raises on a malformed value or two arguments that contradict each other or `name`."""
    for label, value in (("num_gpus", num_gpus), ("cpu_replicas", cpu_replicas)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{label} must be an integer; got {value!r}")
    if num_gpus is not None and num_gpus < 0:
        raise ValueError(f"num_gpus must be >= 0; got {num_gpus}")
    if cpu_replicas is not None and cpu_replicas < 1:
        raise ValueError(f"cpu_replicas must be >= 1; got {cpu_replicas}")
    for label, unit, value in (
        ("bucket_mb", "megabytes (the gradient bucket size)", bucket_mb),
        ("timeout_s", "seconds (the collective timeout)", timeout_s),
    ):
        positive_number(value, label, unit=unit, or_none=True)
    if devices is not None and (isinstance(devices, str) or not devices):
        raise ValueError(
            f"devices must be a non-empty list of device names such as ['GPU:0', 'GPU:1']; "
            f"got {devices!r}"
        )
    given = [
        label
        for label, value in (
            ("devices", devices),
            ("num_gpus", num_gpus),
            ("cpu_replicas", cpu_replicas),
        )
        if value is not None
    ]
    if len(given) > 1:
        raise ValueError(
            f"{' and '.join(given)} both choose the replica devices; pass only one of them"
        )
    if name == "default" and given:
        raise ValueError(f"kind='default' runs without distribution; it takes no {given[0]}")
    if name == "multi_worker" and (devices is not None or cpu_replicas is not None):
        raise ValueError(
            "kind='multi_worker' uses every GPU of each worker (or its CPU); it takes no "
            f"{given[0]}. Use num_gpus to limit the GPUs per worker."
        )
    if name == "one_device":
        if devices is not None and len(devices) != 1:
            raise ValueError(f"kind='one_device' takes exactly one device; got {list(devices)}")
        if (num_gpus or 0) > 1 or (cpu_replicas or 0) > 1:
            raise ValueError(
                "kind='one_device' runs one replica; num_gpus or cpu_replicas above 1 "
                "contradicts it. Use kind='mirrored' for several replicas."
            )


def warn_unused_all_reduce(all_reduce: str, bucket_mb, timeout_s) -> None:
    """Warns once that ``auto`` chose one device, so all-reduce options are ignored."""
    unused = [
        f"{label}={value!r}"
        for label, value in (
            ("all_reduce", all_reduce),
            ("bucket_mb", bucket_mb),
            ("timeout_s", timeout_s),
        )
        if value not in (None, "auto")
    ]
    if unused:
        chief.warn_once(
            "unused-all-reduce",
            f"kind='auto' chose one device here, so {', '.join(unused)} has nothing to all-reduce "
            "and is ignored.",
        )


def refuse_all_reduce_options(kind: str, all_reduce: str, bucket_mb, timeout_s) -> None:
    """Raises when a one-replica kind was asked for explicitly with all-reduce options."""
    if all_reduce != "auto" or bucket_mb is not None or timeout_s is not None:
        raise ValueError(
            f"kind={kind!r} runs one replica with nothing to all-reduce; all_reduce, bucket_mb "
            "and timeout_s apply to 'mirrored' and 'multi_worker'"
        )
