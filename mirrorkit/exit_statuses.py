"""Every exit status mirrorkit's processes and commands end with, and what each means.

The one home of this contract: the `mirrorkit` commands, the launcher, the
start-up wait, the hang watchdog and preemption take their statuses from here,
and the Contracts page (docs: contracts/) lists `STATUSES` as a table (a test keeps the page and
this module equal). Where a convention exists mirrorkit keeps it: 2 for bad
arguments (argparse), 124 for a time limit (coreutils' ``timeout``), 128 + N
for a process ended by signal N (the shells'), 42 for a preemption checkpoint
(TensorFlow's own `PreemptionCheckpointHandler`).

`mirrorkit launch` ends with a failed worker's own status (1-255), so a
worker's statuses below reach the shell unchanged; a worker killed by a signal
(Python's negative return code) ends the launch with `FAILED`.

Standard library only: the launcher and the worker entry points read it without
TensorFlow or Keras.

Example:
```python
from mirrorkit import exit_statuses

meaning = {status.code: status.meaning for status in exit_statuses.STATUSES}
print(meaning[exit_statuses.STEP_HUNG])  # a training step never completed ...
```
"""

from __future__ import annotations

import dataclasses

#: Success.
OK = 0
#: A failure with no status of its own (an error, a worker function that raised).
FAILED = 1
#: Bad arguments: nothing was started (argparse's own status).
BAD_ARGUMENTS = 2
#: A worker saved its preemption checkpoint on SIGTERM and exited.
PREEMPTED = 42
#: A training step never completed: the hang watchdog ended the worker.
STEP_HUNG = 43
#: `mirrorkit launch --timeout S`: the whole job ran past its time limit.
TIMED_OUT = 124
#: Ctrl-C (128 + SIGINT).
INTERRUPTED = 130
#: The start-up wait for the peers was ended (128 + SIGKILL).
STARTUP_STOPPED = 137
#: `mirrorkit launch` got SIGTERM and its workers did not end in time (128 + SIGTERM).
TERMINATED = 143


@dataclasses.dataclass(frozen=True)
class ExitStatus:
    """One exit status: its code, its name here, what it means, and who ends with it.

    Attributes:
        code: the number the process ends with.
        name: the constant in this module.
        meaning: what happened.
        returned_by: which mirrorkit processes or commands end with it.
    """

    code: int
    name: str
    meaning: str
    returned_by: str


#: The table, in the order of the codes (docs: contracts/ shows it).
STATUSES = (
    ExitStatus(OK, "OK", "success", "every command and worker"),
    ExitStatus(
        FAILED,
        "FAILED",
        "a failure with no status of its own: an error (Python's own status for an uncaught "
        "exception); `mirrorkit info`: a malformed cluster; `mirrorkit demo`: training failed or "
        "the accuracy fell below the stated target; `mirrorkit plan`: the model does not fit; "
        "`mirrorkit launch`: a worker killed by a signal; the hang watchdog's C backstop (the "
        "Python thread could not run)",
        "every command; `mk.launch` and local-job workers; the hang watchdog's backstop",
    ),
    ExitStatus(
        BAD_ARGUMENTS,
        "BAD_ARGUMENTS",
        "bad arguments or flags: the message names the argument and what to give; nothing "
        "was started",
        "`mirrorkit launch`, `bench`, `demo`, `plan` (and argparse itself)",
    ),
    ExitStatus(
        PREEMPTED,
        "PREEMPTED",
        "preempted (SIGTERM): every worker saved the preemption checkpoint at the same step; "
        "run the same command again to resume (never restarted by `--max-restarts`)",
        "a worker with `mk.PreemptionCheckpoint`; `mirrorkit launch`",
    ),
    ExitStatus(
        STEP_HUNG,
        "STEP_HUNG",
        "a training step never completed within `hang_timeout_s`: the worker named the step "
        "and dumped its Python stacks",
        "a worker with `mk.callbacks.HangWatchdog` (`mirrorkit launch --hang-timeout S`); "
        "`mirrorkit launch`",
    ),
    ExitStatus(
        TIMED_OUT,
        "TIMED_OUT",
        "the whole job ran past `--timeout S`; every worker was stopped (coreutils' "
        "`timeout` convention)",
        "`mirrorkit launch --timeout S`",
    ),
    ExitStatus(
        INTERRUPTED,
        "INTERRUPTED",
        "interrupted (Ctrl-C, or SIGTERM to a command that is not `launch`); every worker was "
        "stopped",
        "`mirrorkit launch`, `mirrorkit demo`",
    ),
    ExitStatus(
        STARTUP_STOPPED,
        "STARTUP_STOPPED",
        "a multi-worker strategy's wait for its peers ended: `startup_timeout_s` passed, or "
        "Ctrl-C/SIGTERM came during the wait; the message names the workers that never came "
        "up (the process is SIGKILLed, so Python's subprocess sees -9)",
        "a worker creating a multi-worker strategy (`mk.strategy`)",
    ),
    ExitStatus(
        TERMINATED,
        "TERMINATED",
        "`mirrorkit launch` got SIGTERM and its workers had not ended 30 s later (or a second "
        "SIGTERM came); every worker was stopped",
        "`mirrorkit launch`",
    ),
)
