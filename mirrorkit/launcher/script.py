"""`mirrorkit launch`: run a script or module as N local workers of one job."""

from __future__ import annotations

import argparse
import sys

from mirrorkit.launcher import cluster_spec, processes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds `mirrorkit launch`'s flags to `parser`."""
    parser.add_argument(
        "-n",
        "--nproc",
        "--num-workers",
        dest="num_workers",
        type=int,
        default=2,
        help="how many worker processes to start on this machine (default 2)",
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
    parser.add_argument("target", metavar="TARGET", help="the training script (or module with -m)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to TARGET")


def run(args: argparse.Namespace) -> int:
    """Runs the launch described by parsed `args`; returns the exit code."""
    if args.num_workers < 1:
        print(f"mirrorkit launch: -n must be at least 1; got {args.num_workers}", file=sys.stderr)
        return 2
    target = ["-m", args.target] if args.module else [args.target]
    command = [sys.executable, *target, *args.args]
    addresses = cluster_spec.local_addresses(args.num_workers)

    print(
        f"mirrorkit launch: {args.num_workers} workers on {', '.join(addresses)}",
        file=sys.stderr,
        flush=True,
    )
    try:
        processes.run_commands(
            [command] * args.num_workers,
            env=lambda i: cluster_spec.worker_env(addresses, i),
            timeout_s=args.timeout_s,
        )
    except processes.WorkerError as err:
        print(
            f"mirrorkit launch: worker {err.worker} failed with exit code {err.exit_code}; "
            "the other workers were stopped",
            file=sys.stderr,
            flush=True,
        )
        return err.exit_code if 0 < err.exit_code < 256 else 1
    except TimeoutError as err:
        print(f"mirrorkit launch: {err}", file=sys.stderr, flush=True)
        return 124
    except KeyboardInterrupt:
        print("mirrorkit launch: interrupted; every worker was stopped", file=sys.stderr)
        return 130
    return 0
