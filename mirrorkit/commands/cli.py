"""The `mirrorkit` command: one entry point, one subcommand per job."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Sequence

from mirrorkit.environment_variables import TF_CPP_MIN_LOG_LEVEL
from mirrorkit.exit_statuses import FAILED, OK


def _info(args: argparse.Namespace) -> int:
    from mirrorkit.commands import info

    facts = info.collect()
    print(json.dumps(facts, indent=2) if args.json else info.format_text(facts))
    if "error" in facts["cluster"]:
        print(f"mirrorkit info: {facts['cluster']['error']}", file=sys.stderr)
        return FAILED
    return OK


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `mirrorkit` command."""
    parser = argparse.ArgumentParser(
        prog="mirrorkit",
        description="Synchronous data-parallel training of Keras 3 models on TensorFlow.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    info = sub.add_parser(
        "info", help="versions, devices, cluster, and the strategy mk.strategy() would make"
    )
    info.add_argument("--json", action="store_true", help="print JSON instead of text")
    info.set_defaults(run=_info)
    from mirrorkit.commands import demo, launch, plan

    launch_parser = sub.add_parser(
        "launch", help="run a training script as N local workers (TF_CONFIG on loopback)"
    )
    launch.add_arguments(launch_parser)
    launch_parser.set_defaults(run=launch.run)
    bench_parser = sub.add_parser(
        "bench", help="throughput, scaling efficiency and all-reduce bandwidth on this machine"
    )
    bench_parser.set_defaults(run=_bench)
    _add_bench_arguments(bench_parser)
    demo_parser = sub.add_parser(
        "demo", help="train an image classifier data-parallel on bundled real data (no network)"
    )
    demo.add_arguments(demo_parser)
    demo_parser.set_defaults(run=demo.run)
    plan_parser = sub.add_parser(
        "plan", help="memory per replica of a bundled model; the largest batch"
    )
    plan.add_arguments(plan_parser)
    plan_parser.set_defaults(run=plan.run)
    return parser


def _add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    from mirrorkit.commands import bench

    bench.add_arguments(parser)


def _bench(args: argparse.Namespace) -> int:
    from mirrorkit.commands import bench

    return bench.run(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the `mirrorkit` command; returns its exit code."""
    os.environ.setdefault(TF_CPP_MIN_LOG_LEVEL, "2")
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[2:] if argv is None else argv[1:])
    signal.signal(signal.SIGTERM, _raise_interrupt)
    return args.run(args)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt  # SIGTERM stops every worker, as Ctrl-C does


if __name__ == "__main__":
    sys.exit(main())
