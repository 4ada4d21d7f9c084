"""The processes mirrorkit starts as they are: no worker pinning, environment or prefixed output.

Every process mirrorkit starts is started in `mirrorkit.launcher` (a test checks
it); the workers of a job by `processes` and `local_job.run_job`, and these
three here, each by a function named for what it starts:

- `start_peer_wait_watcher`: the standard-library helper that bounds a
  multi-worker strategy's wait for its peers (`mirrorkit.strategies.peer_wait`);
- `run_scancel`: ``scancel`` of a Slurm step whose worker failed
  (`mirrorkit launch`);
- `run_plain_workers`: the workers of `mirrorkit bench`'s raw job, plain
  ``python`` processes with exactly the environment given.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: The watcher's script: standard library only, run with ``python -I``.
PEER_WAIT_WATCHER = Path(__file__).resolve().parent.parent / "strategies" / "_peer_wait_watcher.py"
#: Seconds the watcher has to exit once told to (its input closed), before it is killed.
WATCHER_EXIT_S = 10


def start_peer_wait_watcher(spec: Mapping[str, Any], wakeup_fd: int) -> subprocess.Popen:
    """Starts the peer-wait watcher (``python -I _peer_wait_watcher.py SPEC``).

    Args:
        spec: what it watches (JSON-serialisable: the parent's pid, the timeout,
            the tasks); see `mirrorkit.strategies.peer_wait.watch`.
        wakeup_fd: the read end of the parent's signal wakeup pipe, passed on.

    Returns:
        The watcher; `end_peer_wait_watcher` ends it.

    Example:
    ```python
    import os
    from mirrorkit.exit_statuses import STARTUP_STOPPED
    from mirrorkit.launcher import plain_processes

    read, write = os.pipe()
    spec = {"parent": os.getpid(), "timeout": 600.0, "every": 5.0, "tasks": [],
            "rank": 0, "chief": True, "status": STARTUP_STOPPED, "wakeup": read}
    watcher = plain_processes.start_peer_wait_watcher(spec, read)
    plain_processes.end_peer_wait_watcher(watcher)
    ```
    """
    return subprocess.Popen(
        [sys.executable, "-I", str(PEER_WAIT_WATCHER), json.dumps(dict(spec))],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        pass_fds=(wakeup_fd,),
    )


def end_peer_wait_watcher(watcher: subprocess.Popen) -> None:
    """Closes the watcher's input (it exits at end of input); kills it after `WATCHER_EXIT_S`."""
    watcher.stdin.close()
    try:
        watcher.wait(timeout=WATCHER_EXIT_S)
    except subprocess.TimeoutExpired:
        watcher.kill()
        watcher.wait()


def run_scancel(step: str, signal_name: str = "TERM", timeout_s: float = 30) -> str:
    """Runs ``scancel --signal=SIGNAL STEP``; returns why it failed, or ``""``.

    Args:
        step: the Slurm step, ``JOB.STEP``.
        signal_name: the signal every task of the step gets.
        timeout_s: how long ``scancel`` may take.

    Returns:
        ``""`` when scancel succeeded, else its error output (or exit status,
        or why it could not run).

    Example:
    ```python
    from mirrorkit.launcher import plain_processes

    why = plain_processes.run_scancel("1234.0")  # "" once the step was signalled
    ```
    """
    try:
        done = subprocess.run(
            ["scancel", f"--signal={signal_name}", step],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return str(err)
    if not done.returncode:
        return ""
    return done.stderr.strip() or f"exit status {done.returncode}"


def run_plain_workers(
    argvs: Sequence[Sequence[str]], envs: Sequence[Mapping[str, str]], timeout_s: float
) -> None:
    """Runs one plain process per worker, each with exactly its environment, to the end.

    Args:
        argvs: ``argvs[i]`` is worker i's argument vector.
        envs: ``envs[i]`` is worker i's whole environment.
        timeout_s: seconds each worker may take.

    Raises:
        RuntimeError: a worker exited non-zero (its last output attached); the
            others were killed.
        subprocess.TimeoutExpired: a worker ran past `timeout_s`; every worker
            was killed.

    Example:
    ```python
    import os
    import sys
    from mirrorkit.launcher import plain_processes

    plain_processes.run_plain_workers(
        [[sys.executable, "-c", "print('hello')"]], [dict(os.environ)], timeout_s=60
    )
    ```
    """
    with tempfile.TemporaryDirectory(prefix="mirrorkit-plain-") as tmp:
        logs = [open(os.path.join(tmp, f"worker-{i}.log"), "w+") for i in range(len(argvs))]
        procs: list[subprocess.Popen] = []
        try:
            for argv, env, log in zip(argvs, envs, logs, strict=True):
                procs.append(
                    subprocess.Popen(
                        list(argv), env=dict(env), stdout=log, stderr=subprocess.STDOUT
                    )
                )
            for i, proc in enumerate(procs):
                if proc.wait(timeout=timeout_s) != 0:
                    logs[i].seek(0)
                    tail = logs[i].read()[-3000:]
                    raise RuntimeError(f"raw worker {i} exited {proc.returncode}:\n{tail}")
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            for log in logs:
                log.close()
