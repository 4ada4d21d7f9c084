"""Supervise a launch's workers from inside a new network namespace.

Usage: ``python -m mirrorkit.launcher._sandbox SPEC RESULT``. Enters a private
network namespace (see `netns`), runs the workers that SPEC (JSON) describes
with `processes.run_commands`, streaming their prefixed output, and writes the
outcome to RESULT (JSON) for the launcher outside. SIGTERM stops every worker.
With SPEC's ``reach`` ports it first listens on them inside the namespace and
hands the sockets to the launcher (`relay`), before any worker starts.
"""

from __future__ import annotations

import json
import signal
import sys

from mirrorkit.exit_statuses import FAILED, OK


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(spec_path: str, result_path: str) -> int:
    """Runs the job in SPEC; returns this process's exit code."""
    from mirrorkit.launcher import netns

    netns.enter()  # first, while this process has one thread
    signal.signal(signal.SIGTERM, _interrupt)
    from mirrorkit.launcher import processes, relay

    with open(spec_path) as f:
        spec = json.load(f)
    if spec.get("reach"):
        relay.open_listeners(spec["relay_fd"], spec["reach"])
    outcome = {"status": "ok"}
    try:
        processes.run_commands(
            spec["commands"],
            env=lambda i: spec["envs"][i],
            timeout_s=spec["timeout_s"],
            prefix=spec["prefix"],
            log_dir=spec["log_dir"],
            first=spec.get("first", 0),
        )
    except processes.WorkerError as err:
        outcome = {
            "status": "failed",
            "worker": err.worker,
            "exit_code": err.exit_code,
            "tail": err.worker_traceback,
        }
    except TimeoutError as err:
        outcome = {"status": "timeout", "message": str(err)}
    except KeyboardInterrupt:
        outcome = {"status": "interrupted"}
    with open(result_path, "w") as f:
        json.dump(outcome, f)
    return OK if outcome["status"] == "ok" else FAILED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
