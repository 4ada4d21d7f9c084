"""The start-up watcher: a tiny helper process, standard library only.

`mirrorkit.strategies.peer_wait` runs this file (``python -I _peer_wait_watcher.py SPEC``) while
a multi-worker strategy's constructor waits for its peers. That constructor
blocks inside TensorFlow's C++ runtime holding the GIL, and TensorFlow's
preemption notifier swallows SIGTERM, so nothing in the waiting process itself
can report or stop the wait. This process can:

- every ``every`` seconds (the first time after twice that, so that a normal
  staggered start-up stays quiet) it probes each peer's ``host:port`` (a TCP
  connect, closed at once) and, on the chief, prints which tasks are not up yet;
- it reads ``/proc/<parent>/status`` (``SigPnd``/``ShdPnd``) for a SIGTERM or
  SIGINT that the parent blocks during the wait, reads the parent's wakeup
  descriptor (``wakeup``: Python's C-level handler writes the number of a
  signal it caught there, SIGINT sent to the parent alone), and catches those
  signals itself when they are sent to the whole process group (Ctrl-C);
- after ``timeout`` seconds, or on such a signal, it prints the error and
  SIGKILLs the parent (exit status 137, -9 to Python's subprocess);
- it exits by itself when its stdin closes: the constructor returned (the
  parent closes the pipe) or the parent died.

SPEC is one JSON object: ``parent`` (pid), ``timeout`` (s), ``every`` (s),
``tasks`` ([[rank, "host:port"], ...], the peers, not this task), ``rank``
(this task's), ``chief`` (whether to print the progress lines), ``status``
(the parent's exit status once SIGKILLed, for the messages), ``wakeup``
(the read end of the parent's wakeup descriptor, inherited; optional).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import time

_WATCHED = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "SIGINT (Ctrl-C)"}
_caught: list[int] = []
_STOP_HINT = (
    ". To stop the wait: Ctrl-C, SIGINT (kill -INT PID), or SIGTERM to the process group "
    "(kill -TERM -PGID); a SIGTERM to this process alone is caught by TensorFlow and ends "
    "the wait only at startup_timeout_s"
)
#: The hint where this process ignores SIGINT: it inherited SIG_IGN (started in the background
#: by a shell script, under nohup-like tools), so Ctrl-C and kill -INT never reach it.
_STOP_HINT_SIGINT_IGNORED = (
    ". To stop the wait: SIGTERM to the process group (kill -TERM -PGID). This process ignores "
    "SIGINT (it was started with SIGINT ignored, e.g. in the background by a script), so "
    "Ctrl-C and kill -INT do not reach it; a SIGTERM to this process alone is caught by "
    "TensorFlow and ends the wait only at startup_timeout_s"
)


def _pending(pid: int) -> str | None:
    """The watched signal pending on process `pid` (blocked there), if any."""
    try:
        with open(f"/proc/{pid}/status") as status:
            lines = status.read().splitlines()
    except OSError:
        return None
    mask = 0
    for line in lines:
        if line.startswith(("SigPnd:", "ShdPnd:")):
            mask |= int(line.split()[1], 16)
    for number, name in _WATCHED.items():
        if mask & (1 << (number - 1)):
            return name
    return None


def _up(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
            return True
    except (OSError, ValueError):
        return False


def _missing(tasks: list) -> list:
    return [(rank, address) for rank, address in tasks if not _up(address)]


def _names(missing: list) -> str:
    return ", ".join(f"worker {rank} ({address})" for rank, address in missing)


def _say(text: str) -> None:
    sys.stderr.write(f"mirrorkit: {text}\n")
    sys.stderr.flush()


def _end(parent: int, text: str) -> None:
    _say(text)
    try:
        os.kill(parent, signal.SIGKILL)
    except ProcessLookupError:
        pass


def main(spec: dict) -> None:
    parent, timeout, every = spec["parent"], float(spec["timeout"]), float(spec["every"])
    tasks, rank, chief, status = spec["tasks"], spec["rank"], spec["chief"], spec["status"]
    for number in _WATCHED:
        signal.signal(number, lambda n, _frame: _caught.append(n))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _WATCHED)  # exec keeps the parent's mask
    wakeup = spec.get("wakeup")
    watched = [sys.stdin] + ([wakeup] if wakeup is not None else [])
    start = time.monotonic()
    next_report, hinted = start + 2 * every, False  # quiet while a normal start-up staggers
    while True:
        ready, _, _ = select.select(watched, [], [], 0.25)
        if sys.stdin in ready and not os.read(sys.stdin.fileno(), 4096):
            return  # the constructor returned, or the parent died
        if wakeup in ready:
            numbers = os.read(wakeup, 64)
            if not numbers:
                watched.remove(wakeup)  # the parent closed it: stdin says the rest
            _caught.extend(n for n in numbers if n in _WATCHED)
        signal_name = _pending(parent) or (_WATCHED[_caught[0]] if _caught else None)
        if signal_name:
            _end(
                parent,
                f"{signal_name} received while worker {rank} waited for its peers to start; "
                f"stopped the wait after {time.monotonic() - start:.0f} s (exit status {status}).",
            )
            return
        now = time.monotonic()
        if now - start >= timeout:
            missing = _missing(tasks)
            who = (
                f"never came up: {_names(missing)}"
                if missing
                else "all answer on their ports but did not join"
            )
            _end(
                parent,
                f"worker {rank} waited {timeout:g} s (startup_timeout_s) for the other workers "
                f"of the multi-worker job, and {who}. Check that every task in TF_CONFIG (or "
                "the Slurm step) was started, that each host:port is right and reachable from "
                "this host (no typo, no firewall), and that every task uses the same cluster "
                "spec. Raise startup_timeout_s (--startup_timeout) if the workers start slowly. "
                f"This process was stopped (exit status {status}).",
            )
            return
        if now >= next_report:
            next_report += every
            if chief:
                missing = _missing(tasks)
                progress = (
                    f"not up yet: {_names(missing)}"
                    if missing
                    else "all tasks answer; waiting for them to join"
                )
                stop = _STOP_HINT_SIGINT_IGNORED if spec.get("sigint_ignored") else _STOP_HINT
                hint = "" if hinted else stop
                hinted = True
                _say(
                    f"waiting for the other workers ({now - start:.0f} s of "
                    f"{timeout:g} s startup_timeout_s): {progress}{hint}"
                )


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
