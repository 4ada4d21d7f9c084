"""`mirrorkit launch --max-restarts N`: a failed worker relaunches the whole job.

TensorFlow's collectives cannot take a replacement worker into a running job,
so a restart is of every worker: the launcher has already stopped the others
(fail-fast), and `run_with_restarts` starts the job again, on fresh ports, with
``MIRRORKIT_RESTART`` set to the attempt number. A script that trains with
`keras.callbacks.BackupAndRestore` (on a directory every attempt sees) resumes
from its last backup; one without it starts over. Each restart is said with its
cause; after N restarts the last failure is the job's.
"""

from __future__ import annotations

from collections.abc import Callable

from mirrorkit.launcher.processes import WorkerError

#: Environment variable holding the attempt number (0: the first launch).
ENV = "MIRRORKIT_RESTART"


def run_with_restarts(
    run_once: Callable[[int], None],
    max_restarts: int,
    say: Callable[[str], None],
    *,
    describe: Callable[[WorkerError], str] = str,
) -> int:
    """Runs `run_once(attempt)` until it returns, restarting on `WorkerError`.

    Args:
        run_once: runs the whole job once; ``attempt`` counts from 0.
        max_restarts: how many times a failed job is started again.
        say: prints one launcher line.
        describe: how a failure is named in the restart line.

    Returns:
        How many restarts it took.

    Raises:
        WorkerError: the last failure, once `max_restarts` are used up.

    Example:
    ```python
    from mirrorkit.faults.restart import run_with_restarts

    run_with_restarts(lambda attempt: start_job(attempt), 3, print)
    ```
    """
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"max_restarts={max_restarts!r}: give a whole number >= 0")
    attempt = 0
    while True:
        try:
            run_once(attempt)
            if attempt:
                say(f"the job finished after {attempt} restart(s)")
            return attempt
        except WorkerError as err:
            if attempt >= max_restarts:
                if max_restarts:
                    say(f"{describe(err)}; no restart left (--max-restarts {max_restarts})")
                raise
            attempt += 1
            say(
                f"restart {attempt} of {max_restarts}: {describe(err)}; every worker was "
                "stopped and the whole job starts again on fresh ports (it resumes from its "
                "last BackupAndRestore backup, if it keeps one)"
            )
