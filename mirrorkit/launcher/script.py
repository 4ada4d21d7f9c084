"""`mirrorkit launch`: run a script or module as the workers of one job.

On one machine (the default) the workers get TF_CONFIG on loopback with free
ports, their own CPU cores, and a private network namespace. Across machines
(``--nnodes``/``--hosts``, or a multi-node Slurm allocation) every host runs
the same command and computes the same cluster spec.
"""

from __future__ import annotations

import argparse
import os
import sys

from mirrorkit.launcher import (
    allocator,
    cluster_spec,
    hosts,
    netns,
    pinning,
    processes,
    tf_noise,
)


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
        help=f"first worker port on each host in a multi-host job (default {hosts.DEFAULT_PORT})",
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
    slurm = hosts.from_slurm(env, args.num_workers, port)
    if slurm is not None:
        return slurm
    if args.port is not None:
        _say(
            f"--port {args.port} is for multi-host jobs (--hosts, or Slurm); workers on one "
            "host take free loopback ports, so it is not used"
        )
    addresses = cluster_spec.local_addresses(args.num_workers)
    return hosts.Layout(tuple(addresses), 0, args.num_workers, False)


def run(args: argparse.Namespace) -> int:
    """Runs the launch described by parsed `args`; returns the exit code."""
    try:
        job = layout(args)
    except ValueError as err:
        print(f"mirrorkit launch: {err}", file=sys.stderr)
        return 2
    if not args.module and not os.path.isfile(args.target):
        print(
            f"mirrorkit launch: script {args.target!r} does not exist (working directory "
            f"{os.getcwd()}); no worker was started. Give the path of a Python file, or "
            "-m MODULE for a module.",
            file=sys.stderr,
        )
        return 2
    target = ["-m", args.target] if args.module else [args.target]
    command = [sys.executable, *target, *args.args]
    cpus = plan_cpus(job.local_workers, args.pin)
    plan_allocator()
    private = plan_network(job, args.private_network)
    ranks = job.local_ranks
    _say(
        f"workers {ranks.start}-{ranks.stop - 1} of {len(job.addresses)} on this host; "
        f"cluster {', '.join(job.addresses)}"
    )
    if args.tf_startup_logs:
        os.environ[tf_noise.ENV_KEEP] = "1"  # read by the launch, see tf_noise
    try:
        processes.run_commands(
            [command] * job.local_workers,
            env=lambda i: cluster_spec.worker_env(job.addresses, job.first_rank + i),
            timeout_s=args.timeout_s,
            log_dir=args.log_dir,
            cpus=cpus,
            private_network=private,
        )
    except processes.WorkerError as err:
        worker = job.first_rank + err.worker
        _say(
            f"worker {worker} failed with exit code {err.exit_code}; "
            "the other workers on this host were stopped"
        )
        return err.exit_code if 0 < err.exit_code < 256 else 1
    except TimeoutError as err:
        _say(str(err))
        return 124
    except KeyboardInterrupt:
        _say("interrupted; every worker was stopped")
        return 130
    return 0


def plan_cpus(num_workers: int, pin: bool) -> list[list[int]] | None:
    """Each local worker's CPUs when pinning is wanted and possible; says what it did."""
    if not pin:
        return None
    groups = pinning.split_cpus(num_workers)
    if groups is None:
        cpus = pinning.available_cpus()
        why = "CPU affinity is not supported here" if cpus is None else f"only {len(cpus)} CPUs"
        _say_once(f"not pinning: {num_workers} workers but {why}")
        return None
    _say_once(
        f"pinning each worker to its own CPUs ({pinning.describe(groups)}) with TensorFlow "
        "thread pools of that size; --no-pin turns this off"
    )
    return groups


def plan_allocator() -> None:
    """Says once what the workers' memory allocator keeps (`allocator`), when it applies."""
    if allocator.malloc_env():
        _say_once(allocator.describe())


def plan_network(job: hosts.Layout, wanted: bool) -> bool:
    """Whether the workers get a private network namespace; warns when they cannot."""
    warning = (
        "TensorFlow's worker servers have no authentication and listen on every interface "
        "(tensorflow#11689): anyone who can reach this machine's ports can run code in the "
        "workers. Run only on a trusted network or behind a firewall."
    )
    if job.multi_host:
        _say_once(f"WARNING: multi-host job. {warning}")
        return False
    if not wanted:
        _say_once(f"WARNING: --shared-network. {warning}")
        return False
    reason = netns.check()
    if reason is not None:
        _say_once(f"WARNING: could not make a private network namespace ({reason}). {warning}")
        return False
    _say_once("workers run in a private network namespace: unreachable from outside this job")
    return True


def _say(message: str) -> None:
    print(f"mirrorkit: {message}", file=sys.stderr, flush=True)


_said: set[str] = set()


def _say_once(message: str) -> None:
    """Says a launch notice the first time this process gives it.

    A notebook's second `mk.launch` with the same settings stays quiet; a
    notice whose text changed (other CPUs, another worker count) is said again.
    """
    if message not in _said:
        _said.add(message)
        _say(message)
