"""Split this machine's CPU cores among local workers, and the matching thread settings.

Two TensorFlow processes on the same cores each start thread pools sized for
the whole machine and take turns on every core; giving each worker its own
cores (CPU affinity) and thread pools of that size is what makes local
workers scale.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from mirrorkit.environment_variables import (
    OMP_NUM_THREADS,
    TF_NUM_INTEROP_THREADS,
    TF_NUM_INTRAOP_THREADS,
)


def available_cpus() -> list[int] | None:
    """The CPUs this process may run on, or None where affinity is not supported."""
    getter = getattr(os, "sched_getaffinity", None)
    return sorted(getter(0)) if getter else None


def split_cpus(num_workers: int, cpus: Sequence[int] | None = None) -> list[list[int]] | None:
    """Divides `cpus` into `num_workers` contiguous, disjoint groups.

    Args:
        num_workers: how many local workers.
        cpus: the CPUs to divide; this process's affinity when None.

    Returns:
        One list of CPU ids per worker (earlier workers get one more when the
        division is uneven), or None when there are fewer CPUs than workers
        or affinity is not supported, in which case nothing is pinned.

    Example:
    ```python
    from mirrorkit.launcher.pinning import split_cpus

    assert split_cpus(2, [0, 1, 2, 3, 4]) == [[0, 1, 2], [3, 4]]
    ```
    """
    cpus = available_cpus() if cpus is None else sorted(cpus)
    if not cpus or num_workers > len(cpus):
        return None
    per_worker, extra = divmod(len(cpus), num_workers)
    groups, start = [], 0
    for i in range(num_workers):
        size = per_worker + (1 if i < extra else 0)
        groups.append(list(cpus[start : start + size]))
        start += size
    return groups


def thread_env(num_cpus: int) -> dict[str, str]:
    """TensorFlow (and oneDNN/OpenMP) thread settings for a worker with `num_cpus` cores.

    Intra-op pools get one thread per core. Inter-op pools get at least two
    threads, so that a collective waiting on its peers never holds the only
    thread that could run the op it waits for.

    Example:
    ```python
    from mirrorkit.launcher.pinning import thread_env

    assert thread_env(1)["TF_NUM_INTRAOP_THREADS"] == "1"
    ```
    """
    return {
        TF_NUM_INTRAOP_THREADS: str(num_cpus),
        TF_NUM_INTEROP_THREADS: str(max(2, num_cpus)),
        OMP_NUM_THREADS: str(num_cpus),
    }


def describe(groups: Sequence[Sequence[int]], first: int = 0) -> str:
    """A short text of each worker's CPUs, e.g. ``w0: 0-1, w1: 2-3``, numbered from `first`."""
    return ", ".join(f"w{first + i}: {_span(group)}" for i, group in enumerate(groups))


def _span(cpus: Sequence[int]) -> str:
    contiguous = list(cpus) == list(range(cpus[0], cpus[0] + len(cpus)))
    if len(cpus) > 1 and contiguous:
        return f"{cpus[0]}-{cpus[-1]}"
    return ",".join(map(str, cpus))
