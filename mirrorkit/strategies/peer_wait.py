"""A multi-worker strategy never waits silently forever for its peers.

`tf.distribute.MultiWorkerMirroredStrategy()` waits inside TensorFlow's C++
runtime until every task of the cluster has started, and it waits holding the
GIL, with SIGTERM caught by TensorFlow's preemption notifier: no Python thread,
signal handler or TensorFlow option ends that wait (measured on TF 2.21). So
`watch` runs the watcher in a small helper process without TensorFlow
(`mirrorkit.strategies._peer_wait_watcher`, started by
`mirrorkit.launcher.plain_processes`) for exactly as long as the constructor runs, and
blocks SIGTERM and SIGINT in this thread meanwhile so that the helper sees them
pending. The helper:

- on the chief, says every few seconds which tasks are not up yet (rank and
  ``host:port``);
- after ``startup_timeout_s`` prints an error naming the tasks that never came
  up and what to check, and ends this process (exit status 137,
  `mirrorkit.exit_statuses.STARTUP_STOPPED`: SIGKILL, the
  one signal TensorFlow cannot catch during the wait);
- on SIGTERM or Ctrl-C during the wait does the same at once.

Which signals it sees (measured on TF 2.21):

- SIGINT, to the process group or to this process alone (Ctrl-C at a
  terminal, ``kill -INT PID``, a supervisor that signals only its child): a
  process-directed signal goes to a thread that does not block it (one numpy's
  BLAS or the user started before the wait), where Python's C-level handler
  writes its number to a wakeup descriptor (`signal.set_wakeup_fd`) that the
  helper reads; a group signal also reaches the helper itself;
- SIGTERM sent to the process group (``kill -TERM -PGID``, Slurm, `mirrorkit
  launch`'s teardown, a container runtime stopping the group), since the
  helper shares the group.

A process that inherited SIGINT ignored (a background job of a shell script,
``nohup``-like tools) never receives SIGINT; its first "waiting for" line says
so and names SIGTERM to the process group instead.

A SIGTERM sent to this process id alone (``kill PID``, a container's PID 1)
is not seen: TensorFlow's preemption notifier installs its own C handler
during the constructor, before the wait, and that handler only sets a flag;
only ``startup_timeout_s`` bounds that case, and the chief's first "waiting
for" line says so, with the signals that do stop the wait.

Once the constructor returns, the helper exits and the signals are unblocked.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
from collections.abc import Iterator

from mirrorkit.cluster import cluster_info
from mirrorkit.exit_statuses import STARTUP_STOPPED
from mirrorkit.launcher import plain_processes

#: Default `mk.strategy(startup_timeout_s=...)`: ten minutes.
DEFAULT_TIMEOUT_S = 600.0
#: Seconds between the chief's "waiting for" lines.
REPORT_EVERY_S = 5.0

_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def check_timeout(startup_timeout_s: object) -> float | None:
    """Checks `mk.strategy(startup_timeout_s=...)`: seconds > 0, or None (wait forever).

    Args:
        startup_timeout_s: the value given.

    Returns:
        The timeout as a float, or None.

    Raises:
        ValueError: not a positive, finite number of seconds, nor None.

    Example:
    ```python
    from mirrorkit.strategies import peer_wait

    peer_wait.check_timeout(60)  # 60.0
    ```
    """
    if startup_timeout_s is None:
        return None
    if isinstance(startup_timeout_s, bool) or not isinstance(startup_timeout_s, (int, float)):
        raise ValueError(
            f"startup_timeout_s={startup_timeout_s!r}: give the seconds a multi-worker strategy "
            "may wait for its peers to start, e.g. startup_timeout_s=600, or None to wait "
            "without limit."
        )
    if not math.isfinite(startup_timeout_s) or startup_timeout_s <= 0:
        raise ValueError(
            f"startup_timeout_s={startup_timeout_s!r} is not a positive number of seconds. "
            "Give e.g. startup_timeout_s=600 (ten minutes, the default), or None to wait "
            "without limit."
        )
    return float(startup_timeout_s)


@contextlib.contextmanager
def watch(
    startup_timeout_s: float | None,
    info: cluster_info.ClusterInfo | None = None,
    *,
    every_s: float = REPORT_EVERY_S,
) -> Iterator[None]:
    """Watches a multi-worker strategy's start-up from outside this process.

    A no-op for a single worker, for ``startup_timeout_s=None``, and off the
    main thread (signals can only be blocked for the thread that waits).

    Args:
        startup_timeout_s: seconds to wait for the peers before ending this
            process with an error naming the missing tasks; None: no limit.
        info: this task's cluster; default: from the environment.
        every_s: seconds between the chief's progress lines.

    Example:
    ```python
    import tensorflow as tf
    from mirrorkit.strategies import peer_wait

    with peer_wait.watch(600):
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    ```
    """
    info = info if info is not None else cluster_info.from_environment()
    if startup_timeout_s is None or not info.is_multi_worker or not _main_thread():
        yield
        return
    spec = {
        "parent": os.getpid(),
        "timeout": startup_timeout_s,
        "every": every_s,
        "tasks": [
            [rank, address]
            for rank, address in enumerate(info.addresses)
            if rank != info.worker_index
        ],
        "rank": info.worker_index,
        "chief": info.is_chief,
        "status": STARTUP_STOPPED,  # what its messages say this process ends with
        # inherited SIG_IGN (a background job of a script): SIGINT never arrives, say so
        "sigint_ignored": signal.getsignal(signal.SIGINT) == signal.SIG_IGN,
    }
    # Python's C-level handler writes the number of each signal it catches (SIGINT) to the
    # wakeup descriptor, from whichever thread the kernel chose, while TensorFlow holds the GIL
    wakeup, wakeup_write = os.pipe()
    os.set_blocking(wakeup_write, False)
    spec["wakeup"] = wakeup
    before = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    previous_wakeup = signal.set_wakeup_fd(wakeup_write, warn_on_full_buffer=False)
    try:
        helper = plain_processes.start_peer_wait_watcher(spec, wakeup)
    finally:
        os.close(wakeup)
    try:
        yield
    finally:
        plain_processes.end_peer_wait_watcher(helper)  # it exits at end of input
        signal.set_wakeup_fd(previous_wakeup)
        os.close(wakeup_write)
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
