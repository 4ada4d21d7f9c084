"""`mirrorkit launch --max-restarts N`: a failed worker relaunches the whole job.

TensorFlow's collectives cannot take a replacement worker into a running job,
so a restart is of every worker: the launcher has already stopped the others
(fail-fast), and `run_with_restarts` starts the job again, on fresh ports, with
``MIRRORKIT_RESTART`` set to the attempt number. A script that trains with
`mk.resumable(dir)` (Keras's `BackupAndRestore`, set up for it) resumes from
its last backup; one without it starts over.

N counts the restarts at one failing step: a job that keeps failing at the
same step (a bad batch, a corrupt backup, out of memory at a given point)
stops after N restarts there, while one that fails somewhere new each time
(preemptible machines) gets N restarts at each place. Where the job failed is
known from `mk.resumable`'s progress record (`mirrorkit.faults.resume_point`); a
job without it has one place, "unknown", so N counts all its restarts.

Each restart is said with its cause, where it failed, where it resumes and
the steps redone, e.g. ``restart 1 of 3: worker 1 killed by SIGKILL at epoch
2 step 5; resuming from the backup at epoch 2 step 0: 5 steps redone``.
"""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Callable

from mirrorkit.faults import resume_point
from mirrorkit.launcher.processes import WorkerError

#: What a restart does, said after each: a job on one host, and on several.
ONE_HOST = "Every worker was stopped and the whole job starts again on fresh ports"
MULTI_HOST = (
    "Every worker on this host was stopped and starts again on the same port; each host's "
    "launcher restarts its own workers when they fail, and the restarted workers wait for "
    "each other (startup_timeout_s), so a host whose link comes back in that time rejoins"
)


@dataclasses.dataclass(frozen=True)
class Failure:
    """Where a failed attempt stopped and where the next one resumes.

    Attributes:
        at: the chief's epoch and step when the job failed; None if unknown.
        resume: where the backup resumes the job; None without a backup.
        steps_per_epoch: the epoch length, for the steps redone.
    """

    at: resume_point.Position | None = None
    resume: resume_point.Position | None = None
    steps_per_epoch: int | None = None

    @classmethod
    def read(cls, progress_file: str | None) -> Failure:
        """What the chief's progress file (and its backup) say about a failed attempt."""
        record = resume_point.read(progress_file)
        if record is None:
            return cls()
        resume = resume_point.backup_position(
            record.backup_dir, record.steps_per_epoch, record.positioned
        )
        return cls(record.at, resume, record.steps_per_epoch)

    def where(self) -> str:
        """`` at epoch E step S`` (or nothing when unknown)."""
        return "" if self.at is None else f" at {self.at}"

    def resuming(self) -> str:
        """How the next attempt resumes, with the steps redone when known."""
        if self.resume is None:
            return (
                "where it resumes is not known here (no mk.resumable progress record): a script "
                "with keras.callbacks.BackupAndRestore resumes from its last backup, one without "
                "a backup starts from the beginning"
            )
        text = f"resuming from the backup at {self.resume}"
        done = None if self.at is None else self.at.steps(self.steps_per_epoch)
        start = self.resume.steps(self.steps_per_epoch)
        if done is not None and start is not None:
            text += f": {max(done - start, 0)} step(s) redone"
        return text


def exit_cause(exit_code: int) -> str:
    """``killed by SIGKILL`` for -9, ``failed with exit code 3`` for 3.

    Example:
    ```python
    from mirrorkit.faults.restart import exit_cause

    assert exit_cause(-9) == "killed by SIGKILL"
    ```
    """
    if exit_code < 0:
        try:
            return f"killed by {signal.Signals(-exit_code).name}"
        except ValueError:
            return f"killed by signal {-exit_code}"
    return f"failed with exit code {exit_code}"


def run_with_restarts(
    run_once: Callable[[int], None],
    max_restarts: int,
    say: Callable[[str], None],
    *,
    describe: Callable[[WorkerError], str] = str,
    failure: Callable[[int], Failure] | None = None,
    restarted: str = ONE_HOST,
) -> int:
    """Runs `run_once(attempt)` until it returns, restarting on `WorkerError`.

    Args:
        run_once: runs the whole job once; ``attempt`` counts from 0.
        max_restarts: how many times the job is started again after failing
            at one step (each step where it fails has its own count).
        say: prints one launcher line.
        describe: how a failure's cause is named (``worker 1 killed by SIGKILL``).
        failure: ``failure(attempt)`` tells where that attempt failed and
            where the next resumes; None: unknown (every failure counts together).
        restarted: what a restart does, said after each (`ONE_HOST`, `MULTI_HOST`).

    Returns:
        How many restarts it took.

    Raises:
        WorkerError: the last failure, once `max_restarts` restarts at the
            step where it failed are used up.

    Example:
    ```python
    from mirrorkit.faults.restart import run_with_restarts
    from mirrorkit.launcher.processes import WorkerError

    def start_job(attempt):  # starts every worker, returns when all are done
        if attempt == 0:
            raise WorkerError(1, -9)  # worker 1 killed by SIGKILL

    assert run_with_restarts(start_job, 3, print) == 1
    ```
    """
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"max_restarts={max_restarts!r}: give a whole number >= 0")
    attempt = 0
    at_step: dict[resume_point.Position | None, int] = {}
    while True:
        try:
            run_once(attempt)
            if attempt:
                say(f"the job finished after {attempt} restart(s)")
            return attempt
        except WorkerError as err:
            where = failure(attempt) if failure else Failure()
            count = at_step.get(where.at, 0)
            if count >= max_restarts:
                if max_restarts:
                    place = "there" if where.at is not None else "(the step is unknown)"
                    say(
                        f"{describe(err)}{where.where()}; no restart left: it failed "
                        f"{count + 1} times {place} (--max-restarts {max_restarts} counts the "
                        "restarts at each failing step)"
                    )
                raise
            at_step[where.at] = count + 1
            attempt += 1
            say(
                f"restart {count + 1} of {max_restarts}: {describe(err)}{where.where()}; "
                f"{where.resuming()}. {restarted}"
            )
