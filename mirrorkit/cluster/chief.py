"""Chief-only side effects: `is_chief()`, `print()`, and say-once notices.

Every worker of a multi-worker job runs the same script. Output, files and
TensorBoard logs belong to one of them, the chief, so that a job of N workers
prints each line once and writes each file once.
"""

from __future__ import annotations

import builtins
import sys
import warnings
from typing import Any

from mirrorkit.cluster import cluster_info

_said: set[str] = set()


def is_chief() -> bool:
    """Returns True in the process that owns side effects of the job.

    The chief is the task of type ``chief`` in ``TF_CONFIG``, else worker 0;
    under a Slurm step it is rank 0 (node 0's first task; `mirrorkit.cluster.slurm`
    numbers the tasks by node, then ``SLURM_LOCALID``); in a single process it
    is that process. The answer comes from the environment alone, so it is
    cheap and never initialises TensorFlow.

    Returns:
        Whether this process is the chief.

    Example:
    ```python
    import keras
    import mirrorkit as mk

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    if mk.is_chief():
        model.save("model.keras")
    ```
    """
    return cluster_info.from_environment().is_chief


def print(*args: Any, **kwargs: Any) -> None:  # noqa: A001 - mirrors builtins.print
    """Prints like the built-in `print`, on the chief only.

    Args:
        *args: What to print, as for `print`.
        **kwargs: `sep`, `end`, `file` and `flush`, as for `print`.

    Example:
    ```python
    import mirrorkit as mk

    mk.print("epoch done")  # once per job, not once per worker
    ```
    """
    if is_chief():
        kwargs.setdefault("flush", True)
        builtins.print(*args, **kwargs)


def say(message: str) -> None:
    """Prints a mirrorkit notice on the chief, prefixed ``mirrorkit:``."""
    if is_chief():
        builtins.print(f"mirrorkit: {message}", file=sys.stderr, flush=True)


def say_once(key: str, message: str) -> None:
    """Says `message` on the chief the first time `key` is seen in this process."""
    if key in _said:
        return
    _said.add(key)
    say(message)


def warn_once(key: str, message: str, category: type[Warning] = UserWarning) -> None:
    """Issues a Python warning on the chief the first time `key` is seen."""
    if key in _said:
        return
    _said.add(key)
    if is_chief():
        warnings.warn(f"mirrorkit: {message}", category, stacklevel=3)
