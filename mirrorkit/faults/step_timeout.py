"""Progress watchdog: a worker whose training step never completes ends, saying where.

A training step that never returns (a deadlocked input pipeline, a
``tf.py_function`` that blocks, a peer stuck so that a collective waits with
no timeout, which is always the case for single-host MirroredStrategy) hangs a
job forever. `Watchdog` notes each completed step; when none completes for
``hang_timeout_s`` it says which worker stopped, in which step, dumps the
Python stacks of every thread (`faulthandler`) to stderr (the worker's log) and
ends the process with `mirrorkit.exit_statuses.STEP_HUNG`.

Two layers, because a step blocked inside TensorFlow's C++ runtime may hold
the GIL:

- a Python thread checks every second and writes the message naming the step
  and the stacks, then ``os._exit(STEP_HUNG)``;
- `faulthandler.dump_traceback_later` (a C thread that needs no GIL), re-armed
  at every step ``BACKSTOP_S`` seconds after the first, dumps the stacks and
  exits with status 1 (`FAILED`: faulthandler's own) if the Python thread could
  not run.

Standard library only: the callback `mirrorkit.callbacks.HangWatchdog` drives it.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time

from mirrorkit.exit_statuses import STEP_HUNG

#: Seconds after ``hang_timeout_s`` at which the C backstop fires.
BACKSTOP_S = 15.0
#: Seconds a worker waits after its dump before it exits, so that its peers,
#: stuck in the same step, dump theirs before a launcher stops them.
LINGER_S = 3.0


class Watchdog:
    """Ends this process when no step completes for ``hang_timeout_s`` seconds.

    Args:
        hang_timeout_s: seconds without a completed step before the process ends.
        worker: how the messages name this process, e.g. ``"worker 1"``.
        poll_s: how often the Python thread looks.

    Example:
    ```python
    from mirrorkit.faults.step_timeout import Watchdog

    dog = Watchdog(300, "worker 0")
    dog.start()
    for step in range(10):
        dog.entering(step, f"step {step}")
        ...  # the step
        dog.completed()
    dog.stop()
    ```
    """

    def __init__(self, hang_timeout_s: float, worker: str, *, poll_s: float = 1.0) -> None:
        self.hang_timeout_s = float(hang_timeout_s)
        self.worker = worker
        self._poll_s = poll_s
        self._where = "before its first step"
        self._completed = 0
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Starts watching (the clock starts now)."""
        self._last = time.monotonic()
        self._stop.clear()
        self._arm()
        self._thread = threading.Thread(target=self._watch, name="mirrorkit-watchdog", daemon=True)
        self._thread.start()

    def entering(self, step: int, where: str) -> None:
        """Notes the step that starts now, named `where` in the message."""
        self._where = where

    def completed(self) -> None:
        """Notes that a step completed: the clock starts again."""
        self._completed += 1
        self._last = time.monotonic()
        self._arm()

    def stop(self) -> None:
        """Stops watching."""
        self._stop.set()
        faulthandler.cancel_dump_traceback_later()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _arm(self) -> None:
        faulthandler.dump_traceback_later(self.hang_timeout_s + BACKSTOP_S, exit=True)

    def _watch(self) -> None:
        while not self._stop.wait(self._poll_s):
            idle = time.monotonic() - self._last
            if idle >= self.hang_timeout_s:
                self._fire(idle)

    def _fire(self, idle: float) -> None:
        sys.stderr.write(
            f"mirrorkit: {self.worker} completed no training step for {idle:.0f} s "
            f"(hang_timeout_s={self.hang_timeout_s:g}); it is stuck in {self._where} "
            f"({self._completed} step(s) completed in this fit). Python stacks of every "
            f"thread follow; this process ends with exit status {STEP_HUNG}. A worker "
            "waiting inside a step usually waits for a peer that is stuck elsewhere: compare "
            "the workers' steps and stacks.\n"
        )
        sys.stderr.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        time.sleep(LINGER_S)
        os._exit(STEP_HUNG)
