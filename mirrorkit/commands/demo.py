"""`mirrorkit demo`: flags, the fresh training process, the verdict.

The training runs in one fresh Python process (`mirrorkit.launcher.processes`):
TensorFlow there can take the requested number of simulated CPU replicas, and
its C++ start-up lines are dropped from the output like a launched worker's
(``--tf-startup-logs`` keeps them). This process never imports TensorFlow.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from mirrorkit.demo import data as data_lib
from mirrorkit.demo import train as train_lib
from mirrorkit.exit_statuses import BAD_ARGUMENTS, FAILED, INTERRUPTED, OK


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds `mirrorkit demo`'s flags to `parser`."""
    defaults = train_lib.DemoConfig()
    parser.description = (
        "Train a small image classifier data-parallel on this machine: on every GPU where "
        "there are any, else on simulated CPU replicas. By default it learns the UCI "
        "handwritten digits that ship with mirrorkit (1,797 8x8 images, CC BY 4.0; no "
        f"network needed) and states a test accuracy of at least "
        f"{train_lib.DIGITS_TARGET_ACCURACY:.2f}; it exits 1 when the run falls short."
    )
    parser.add_argument(
        "--dataset",
        default=data_lib.DIGITS,
        metavar="NAME",
        help="'digits' (bundled, the default) or a tensorflow-datasets image classification "
        "data set already prepared on disk (e.g. mnist); nothing is downloaded",
    )
    parser.add_argument(
        "--data-dir",
        default=None,
        help="tfds data directory holding the prepared --dataset (default: tfds's own, "
        "~/tensorflow_datasets or $TFDS_DATA_DIR)",
    )
    parser.add_argument(
        "--replicas",
        type=_positive,
        default=None,
        help="replicas to train on (default: every GPU, else 2 simulated CPU replicas)",
    )
    parser.add_argument(
        "--epochs",
        type=_positive,
        default=defaults.epochs,
        help=f"passes over the training set (default {defaults.epochs})",
    )
    parser.add_argument(
        "--batch-size",
        type=_positive,
        default=defaults.batch_size,
        help=f"global batch size, all replicas together (default {defaults.batch_size})",
    )
    parser.add_argument(
        "--learning-rate",
        type=float,
        default=defaults.learning_rate,
        help=f"Adam's learning rate (default {defaults.learning_rate:g})",
    )
    parser.add_argument(
        "--seed", type=int, default=defaults.seed, help=f"random seed (default {defaults.seed})"
    )
    parser.add_argument(
        "--tf-startup-logs",
        action="store_true",
        help="keep TensorFlow's C++ start-up lines (cuda drivers, cuInit, ...) in the output",
    )


def run(args: argparse.Namespace) -> int:
    """Runs the demo that parsed `args` describe; returns the exit code.

    0: trained, and on the digits reached the stated accuracy. 1: it fell
    short, or training failed. 2: bad flags or data set (the message says why).
    """
    from mirrorkit.launcher import processes, tf_noise

    if args.replicas is not None and args.batch_size % args.replicas:
        return _fail(
            f"--batch-size {args.batch_size} is the global batch and must divide evenly among "
            f"--replicas {args.replicas}; use a multiple of {args.replicas}"
        )
    config = train_lib.DemoConfig(
        dataset=args.dataset,
        data_dir=args.data_dir,
        replicas=args.replicas,
        epochs=args.epochs,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        seed=args.seed,
    )
    start = time.perf_counter()
    try:
        with tf_noise.keeping(args.tf_startup_logs):
            (result,) = processes.run_function(_train_in_child, (config,), prefix=None)
    except processes.WorkerError as err:
        print(f"mirrorkit demo: training failed\n{err.worker_traceback}", file=sys.stderr)
        return FAILED
    except KeyboardInterrupt:
        print("mirrorkit demo: interrupted", file=sys.stderr)
        return INTERRUPTED
    if "error" in result:
        return _fail(result["error"])
    return _verdict(result, time.perf_counter() - start)


def _train_in_child(config: train_lib.DemoConfig) -> dict[str, Any]:
    """Runs in the fresh process: bad data sets and replica counts come back as messages.

    Anything else that fails raises, and its traceback reaches the user.
    """
    try:
        if config.dataset != data_lib.DIGITS:
            data_lib.open_tfds(config.dataset, config.data_dir)
        replicas = train_lib.make_strategy(config.replicas).num_replicas_in_sync
    except (FileNotFoundError, ValueError) as err:
        return {"error": str(err)}
    if config.batch_size % replicas:
        return {
            "error": f"--batch-size {config.batch_size} is the global batch and must divide "
            f"evenly among the {replicas} replicas here; use a multiple of {replicas}"
        }
    return train_lib.train(config)  # mk.strategy returns the strategy made above


def _verdict(result: dict[str, Any], seconds: float) -> int:
    accuracy, target = result["test_accuracy"], result["target"]
    line = (
        f"test accuracy {accuracy:.4f} on {result['dataset']} after {result['train_seconds']:.1f} "
        f"s of training on {result['replicas']} replica(s), {seconds:.1f} s in all"
    )
    if target is None:
        print(line, flush=True)
        return OK
    reached = accuracy >= target
    print(f"{line}: {'reached' if reached else 'BELOW'} the stated {target:.2f}", flush=True)
    return OK if reached else FAILED


def _fail(message: str) -> int:
    print(f"mirrorkit demo: {message}", file=sys.stderr)
    return BAD_ARGUMENTS


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value
