"""Start one worker: tie its life to its supervisor, pin its CPUs, then exec it.

Usage: ``python -m mirrorkit.launcher._exec [--cpus 0,1] -- COMMAND...``. The
worker receives SIGKILL if the process that started it dies (Linux
``PR_SET_PDEATHSIG``, which survives ``exec``), so no worker outlives a killed
launcher; with ``--cpus`` it runs only on those CPUs. The command then replaces
this process (same pid), so signals and exit codes are the worker's own.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

from mirrorkit.exit_statuses import BAD_ARGUMENTS, FAILED

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(FAILED)


def main(argv: list[str]) -> None:
    """Parses ``[--cpus LIST] -- COMMAND...`` and execs COMMAND."""
    cpus = None
    if argv[:1] == ["--cpus"]:
        cpus = {int(c) for c in argv[1].split(",")}
        argv = argv[2:]
    if argv[:1] != ["--"] or len(argv) < 2:
        usage = "usage: python -m mirrorkit.launcher._exec [--cpus 0,1] -- COMMAND..."
        print(usage, file=sys.stderr)
        sys.exit(BAD_ARGUMENTS)
    command = argv[1:]
    _die_with_parent()
    if cpus is not None:
        os.sched_setaffinity(0, cpus)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
