"""The launcher's side of a preemption: the workers to signal, and the error.

Kept apart from `mirrorkit.faults.preemption_checkpoint` (the Keras callback) so that
`mirrorkit launch` needs neither Keras nor TensorFlow in its own process.
"""

from __future__ import annotations

import os

from mirrorkit.exit_statuses import PREEMPTED


def local_workers(launcher: int, marker: str) -> list[int]:
    """The process ids of `launcher`'s descendants whose environment holds `marker` (Linux).

    `mirrorkit launch` sets its restart variable in every worker's environment, so
    this finds the workers and not the private network's supervisor between them.
    The process tree comes from every ``/proc/PID/stat`` (a task's ``children``
    file misses running children).
    """
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], list(parents.get(launcher, []))
    while todo:
        pid = todo.pop()
        todo += parents.get(pid, [])
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"\0{marker}=".encode() in b"\0" + f.read():
                    found.append(pid)
        except OSError:
            continue
    return sorted(found)


class Preempted(Exception):
    """`mirrorkit launch`: a worker exited with `PREEMPTED` after a preemption checkpoint."""

    def __init__(self, worker: int):
        self.worker = worker
        super().__init__(
            f"worker {worker} was preempted (SIGTERM): every worker saved the preemption "
            f"checkpoint at the same step and exited with status {PREEMPTED}. Run the same "
            "command again to resume from it."
        )
