"""`mirrorkit launch`: run a script or module as the workers of one job.

On one machine (the default) the workers get TF_CONFIG on loopback with free
ports, their own CPU cores, and a private network namespace. Across machines
(``--nnodes``/``--hosts``, or a multi-node Slurm allocation) every host runs
the same command and computes the same cluster spec.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
import time
from collections.abc import Mapping

from mirrorkit.environment_variables import (
    MIRRORKIT_HANG_TIMEOUT,
    MIRRORKIT_PROGRESS,
    MIRRORKIT_RESTART,
    SLURM_JOB_ID,
    SLURM_STEP_ID,
)
from mirrorkit.exit_statuses import (
    BAD_ARGUMENTS,
    FAILED,
    INTERRUPTED,
    OK,
    PREEMPTED,
    STEP_HUNG,
    TERMINATED,
    TIMED_OUT,
)
from mirrorkit.faults import preemption_relay, restart
from mirrorkit.launcher import hosts, local_job, plain_processes, processes
from mirrorkit.launcher.ports import local_addresses


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds `mirrorkit launch`'s flags to `parser`."""
    parser.add_argument(
        "-n",
        "--nproc",
        "--num-workers",
        dest="num_workers",
        type=int,
        default=2,
        help="worker processes to start on this machine (default 2)",
    )
    parser.add_argument(
        "-m",
        dest="module",
        action="store_true",
        help="run TARGET as a module (python -m TARGET), not a script path",
    )
    parser.add_argument(
        "--timeout",
        dest="timeout_s",
        type=float,
        default=None,
        help="stop every worker after this many seconds",
    )
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        help="when a worker fails, stop every worker and start the whole job again (fresh "
        "ports, MIRRORKIT_RESTART set to the attempt), up to N times at the same failing step; "
        "a script whose fit has mk.resumable(dir) resumes from its last backup",
    )
    parser.add_argument(
        "--hang-timeout",
        dest="hang_timeout_s",
        type=float,
        default=None,
        help="a worker whose training step does not complete for this many seconds dumps its "
        f"Python stacks and ends the job (exit {STEP_HUNG}); read by mk.callbacks.HangWatchdog() "
        "in the script's fit callbacks",
    )
    parser.add_argument(
        "--log-dir",
        default=None,
        help="also write each worker's output to LOG_DIR/worker-N.log",
    )
    parser.add_argument(
        "--no-pin",
        dest="pin",
        action="store_false",
        help="do not give each worker its own CPU cores and matching TensorFlow thread pools",
    )
    parser.add_argument(
        "--shared-network",
        dest="private_network",
        action="store_false",
        help="run local workers in this machine's network instead of a private namespace "
        "(their unauthenticated TensorFlow servers are then reachable from outside)",
    )
    parser.add_argument(
        "--reach",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="a service on this machine (127.0.0.1:PORT) that the workers in their private "
        "network reach at the same address, e.g. a tracking server; repeatable. KerasTuner's "
        "oracle (KERASTUNER_ORACLE_IP/PORT on loopback) is reached without it",
    )
    parser.add_argument(
        "--nnodes",
        type=int,
        default=None,
        help="hosts in the job (with --hosts); each host runs this same command",
    )
    parser.add_argument("--node-rank", type=int, default=None, help="this host's index in --hosts")
    parser.add_argument(
        "--hosts",
        default=None,
        help="comma-separated HOST or HOST:PORT of every host, the same on every host",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=None,
        help=f"first worker port on each host in a multi-host job (default {hosts.DEFAULT_PORT}; "
        "under Slurm, MIRRORKIT_PORT, else one from SLURM_JOB_ID: see docs: clusters/slurm/)",
    )
    parser.add_argument(
        "--tf-startup-logs",
        action="store_true",
        help="keep TensorFlow's C++ start-up lines (cuda drivers, cuInit, absl::InitializeLog) "
        "in worker output; dropped by default",
    )
    parser.add_argument("target", metavar="TARGET", help="the training script (or module with -m)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to TARGET")


def layout(args: argparse.Namespace, env: dict[str, str] | None = None) -> hosts.Layout:
    """The job's workers from the flags, else Slurm, else this machine alone.

    Raises:
        ValueError: the multi-host flags disagree; the message says how.
    """
    env = os.environ if env is None else env
    if args.num_workers < 1:
        raise ValueError(f"-n must be at least 1; got {args.num_workers}")
    port = hosts.DEFAULT_PORT if args.port is None else args.port
    hosts.check_ports(port, args.num_workers, f"--port {port}")
    if args.hosts or args.nnodes not in (None, 1) or args.node_rank is not None:
        names = [h.strip() for h in (args.hosts or "").split(",") if h.strip()]
        if not names:
            raise ValueError(
                "--nnodes and --node-rank need --hosts h1,h2,... (the same list on every host)"
            )
        if args.nnodes is not None and args.nnodes != len(names):
            raise ValueError(f"--nnodes {args.nnodes} but --hosts names {len(names)} hosts")
        if args.node_rank is None:
            raise ValueError("--hosts needs --node-rank: this host's index in --hosts")
        return hosts.multi_host(names, args.node_rank, args.num_workers, port)
    slurm, warning = hosts.from_slurm(env, args.num_workers, args.port)
    if warning:
        local_job.say(f"WARNING: {warning}")
    if slurm is not None:
        return slurm
    if args.port is not None:
        local_job.say(
            f"--port {args.port} is for multi-host jobs (--hosts, or Slurm); workers on one "
            "host take free loopback ports, so it is not used"
        )
    addresses = local_addresses(args.num_workers)
    return hosts.Layout(tuple(addresses), 0, args.num_workers, False)


def watchdog_env(hang_timeout_s: float | None):
    """`run_job`'s ``env`` for ``--hang-timeout`` (read by `mk.callbacks.HangWatchdog`)."""
    if hang_timeout_s is None:
        return None
    return lambda _i: {MIRRORKIT_HANG_TIMEOUT: repr(hang_timeout_s)}


def hang_note(exit_code: int, hang_timeout_s: float | None) -> str:
    """What a worker's exit code `STEP_HUNG` means under ``--hang-timeout``."""
    if hang_timeout_s is None or exit_code != STEP_HUNG:
        return ""
    return (
        f" (its hang watchdog: no training step completed for {hang_timeout_s:g} s; the "
        "workers' messages above name the step, and their Python stacks show where each waited)"
    )


#: When this launcher got SIGTERM (empty: never): a Slurm step being ended, for one.
_sigterm_received: list[float] = []


class _Terminated(BaseException):
    """SIGTERM reached the launcher and the workers did not end within the grace period."""


#: Seconds the workers have after a SIGTERM to the launcher before every worker is stopped
#: (Slurm's default KillWait between its SIGTERM and SIGKILL is 30 s).
SIGTERM_GRACE_S = 30


def _forward_sigterm() -> None:
    """SIGTERM to the launcher goes to every worker, which gets `SIGTERM_GRACE_S` to end.

    A worker with `mk.PreemptionCheckpoint` saves at the next step boundary common to
    all workers and exits with `PREEMPTED`; a worker still running after
    the grace period (or at a second SIGTERM) is stopped with the rest.
    """

    def on_sigterm(signum, frame):
        if signal.getitimer(signal.ITIMER_REAL)[0]:  # a second SIGTERM: stop now
            raise _Terminated
        _sigterm_received.append(time.monotonic())
        workers = preemption_relay.local_workers(os.getpid(), MIRRORKIT_RESTART)
        local_job.say(
            f"SIGTERM: sent to {len(workers)} worker(s); waiting up to {SIGTERM_GRACE_S} s for "
            "them to end (mk.PreemptionCheckpoint saves at the next common step boundary)"
        )
        for pid in workers:  # each leads its own process group (its start-up watcher too)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if os.getpgid(pid) == pid:
                    os.killpg(pid, signal.SIGTERM)
                else:
                    os.kill(pid, signal.SIGTERM)
        signal.setitimer(signal.ITIMER_REAL, SIGTERM_GRACE_S)

    def on_alarm(signum, frame):
        raise _Terminated

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGALRM, on_alarm)


#: Seconds a failed launcher of a Slurm step leaves the other tasks to end on their own
#: (TensorFlow ends a collective whose peer is gone within seconds, naming it) before it
#: ends the step with ``scancel``.
SLURM_FAIL_GRACE_S = 10


def end_slurm_step(env: Mapping[str, str], worker: int, grace_s: float = SLURM_FAIL_GRACE_S):
    """Ends this Slurm step after a worker here failed, so no other node waits for it.

    Without ``srun -K`` (``--kill-on-bad-exit``) Slurm lets a step's other
    tasks run on when one fails; a worker that failed before the others'
    start-up would leave them waiting ``startup_timeout_s``. After `grace_s`
    (in which the others usually end by themselves, naming the worker they
    lost), ``scancel --signal=TERM JOB.STEP`` sends every task of the step
    SIGTERM: another node's launcher passes it to its workers, and a worker
    still waiting at start-up ends naming the workers that never came up.

    Args:
        env: the environment (``SLURM_JOB_ID``, ``SLURM_STEP_ID``).
        worker: the job-wide rank of the worker that failed, for the notice.
        grace_s: seconds to wait first.
    """
    if _sigterm_received:  # the step is being ended already (scancel, srun -K, a time limit)
        return
    step = f"{env.get(SLURM_JOB_ID)}.{env.get(SLURM_STEP_ID)}"
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # this launcher is a task of the step too
    time.sleep(grace_s)
    why = plain_processes.run_scancel(step, "TERM")
    if "Invalid job id" in why:  # every other task had ended: nothing is left to stop
        return
    if why:
        local_job.say(
            f"could not end Slurm step {step} after worker {worker} failed ({why}): its other "
            "tasks end when TensorFlow notices, or after startup_timeout_s; srun -K ends a "
            "step at its first failed task"
        )
    else:
        local_job.say(
            f"sent SIGTERM to Slurm step {step} (scancel) {grace_s:g} s after worker {worker} "
            "failed, so no other node waits for it"
        )


def run(args: argparse.Namespace) -> int:
    """Runs the launch described by parsed `args`; returns the exit code."""
    if args.hang_timeout_s is not None and not args.hang_timeout_s > 0:
        print(
            f"mirrorkit launch: --hang-timeout {args.hang_timeout_s:g} is not a positive number "
            "of seconds; give the longest a training step may take, e.g. --hang-timeout 600.",
            file=sys.stderr,
        )
        return BAD_ARGUMENTS
    if args.max_restarts < 0:
        print(f"mirrorkit launch: --max-restarts {args.max_restarts} must be >= 0", file=sys.stderr)
        return BAD_ARGUMENTS
    try:
        job = layout(args)
    except ValueError as err:
        print(f"mirrorkit launch: {err}", file=sys.stderr)
        return BAD_ARGUMENTS
    try:
        local_job.plan_reach(args.reach, wording=None)
    except ValueError as err:
        print(f"mirrorkit launch: --{err}", file=sys.stderr)
        return BAD_ARGUMENTS
    if not args.module and not os.path.isfile(args.target):
        print(
            f"mirrorkit launch: script {args.target!r} does not exist (working directory "
            f"{os.getcwd()}); no worker was started. Give the path of a Python file, or "
            "-m MODULE for a module.",
            file=sys.stderr,
        )
        return BAD_ARGUMENTS

    target = ["-m", args.target] if args.module else [args.target]
    ranks = job.local_ranks
    local_job.say(
        f"workers {ranks.start}-{ranks.stop - 1} of {len(job.addresses)} on this host; "
        f"cluster {', '.join(job.addresses)}"
    )

    progress_dir = tempfile.TemporaryDirectory(prefix="mirrorkit-progress-")
    progress_file = os.path.join(progress_dir.name, "progress.json")

    def run_once(attempt: int) -> None:
        nonlocal job
        job = layout(args) if attempt else job  # fresh ports for a restart
        hang = watchdog_env(args.hang_timeout_s)
        local_job.run_job(
            [sys.executable, *target, *args.args],
            job.local_workers,
            layout=job,
            pin=args.pin,
            private_network=args.private_network,
            reach=args.reach,
            timeout_s=args.timeout_s,
            log_dir=args.log_dir,
            tf_startup_logs=args.tf_startup_logs,
            wording=local_job.FLAGS,
            env=lambda i: {
                MIRRORKIT_RESTART: str(attempt),
                MIRRORKIT_PROGRESS: progress_file,
                **(hang(i) if hang else {}),
            },
        )

    def describe(err: processes.WorkerError) -> str:
        return f"worker {job.first_rank + err.worker} {restart.exit_cause(err.exit_code)}"

    def run_preemptible(attempt: int) -> None:
        try:
            run_once(attempt)
        except processes.WorkerError as err:
            if err.exit_code == PREEMPTED:
                raise preemption_relay.Preempted(job.first_rank + err.worker) from None
            raise

    _forward_sigterm()
    try:
        with progress_dir:
            restart.run_with_restarts(
                run_preemptible,
                args.max_restarts,
                local_job.say,
                describe=describe,
                failure=lambda _attempt: restart.Failure.read(progress_file),
                restarted=(
                    restart.MULTI_HOST
                    if len(job.addresses) > job.local_workers
                    else restart.ONE_HOST
                ),
            )
    except preemption_relay.Preempted as err:
        local_job.say(str(err))
        return PREEMPTED
    except processes.WorkerError as err:
        worker = job.first_rank + err.worker
        local_job.say(
            f"worker {worker} {restart.exit_cause(err.exit_code)}; "
            "the other workers on this host were stopped"
            + hang_note(err.exit_code, args.hang_timeout_s)
            + hosts.lost_peer_note(err.worker_traceback, job)
        )
        if job.slurm:
            end_slurm_step(os.environ, worker)
        return err.exit_code if 0 < err.exit_code < 256 else FAILED
    except TimeoutError as err:
        local_job.say(str(err))
        return TIMED_OUT
    except KeyboardInterrupt:
        local_job.say("interrupted; every worker was stopped")
        return INTERRUPTED
    except _Terminated:
        local_job.say(
            f"SIGTERM: the workers had not ended {SIGTERM_GRACE_S} s after it (or a second "
            "SIGTERM came); every worker was stopped"
        )
        return TERMINATED
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return OK
