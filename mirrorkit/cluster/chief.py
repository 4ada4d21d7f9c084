"""Chief-only side effects: `is_chief()`, `print()`, and mirrorkit's notices.

Every worker of a multi-worker job runs the same script. Output, files and
TensorBoard logs belong to one of them, the chief, so that a job of N workers
prints each line once and writes each file once.

Notices (what mirrorkit chose, repaired or dropped) are said here, on the
chief, once where asked, through the ``"mirrorkit"`` logger (`mirrorkit.notices`).
"""

from __future__ import annotations

import builtins
import logging
import warnings
from typing import Any

from mirrorkit import notices
from mirrorkit.cluster import cluster_info


def is_chief() -> bool:
    """Returns True in the process that owns side effects of the job.

    The chief is the task of type ``chief`` in ``TF_CONFIG``, else worker 0;
    under a Slurm step it is rank 0 (node 0's first task; the tasks are
    numbered by node, then ``SLURM_LOCALID``); in a single process it
    is that process. The answer comes from the environment alone, so it is
    cheap and never initialises TensorFlow.

    Returns:
        Whether this process is the chief.

    It is for your own side effects (a report, an upload, a notification).
    Keras's own saving (``model.save``, ``export``) is called on every worker:
    mirrorkit writes its file once, from the chief (docs: compat/#saving-from-every-worker).

    Example:
    ```python
    import json

    import mirrorkit as mk

    if mk.is_chief():  # one report for the job, not one per worker
        with open("run.json", "w") as f:
            json.dump({"workers": mk.describe(mk.strategy()).num_workers}, f)
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


def say(message: str, level: int = logging.INFO) -> None:
    """Gives a mirrorkit notice on the chief, through the ``"mirrorkit"`` logger.

    Args:
        message: the notice, without the ``mirrorkit:`` prefix.
        level: its logging level (INFO; WARNING for a warning-like notice).

    Example:
    ```python
    import logging
    from mirrorkit.cluster import chief

    chief.say("shown as 'mirrorkit: shown ...' on stderr")
    logging.getLogger("mirrorkit").setLevel(logging.WARNING)
    chief.say("not shown: INFO is below WARNING now")
    logging.getLogger("mirrorkit").setLevel(logging.INFO)
    ```
    """
    if is_chief():
        notices.LOGGER.log(level, message)


def say_once(key: str, message: str, level: int = logging.INFO) -> None:
    """Says `message` on the chief the first time `key` is seen in this process.

    Args:
        key: what makes two notices the same notice.
        message: the notice.
        level: its logging level.
    """
    if notices.first_time(key):
        say(message, level)


def warn_once(key: str, message: str, category: type[Warning] = UserWarning) -> None:
    """Issues a Python warning on the chief the first time `key` is seen.

    Args:
        key: what makes two warnings the same warning (shared with `say_once`).
        message: the warning, without the ``mirrorkit:`` prefix.
        category: the warning's class.
    """
    if notices.first_time(key) and is_chief():
        warnings.warn(f"mirrorkit: {message}", category, stacklevel=3)
