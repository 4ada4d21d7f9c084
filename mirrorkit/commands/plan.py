"""`mirrorkit plan`: `mk.plan_memory` for the bundled benchmark models."""

from __future__ import annotations

import argparse
import sys

from mirrorkit.exit_statuses import BAD_ARGUMENTS, FAILED, OK
from mirrorkit.number_checks import positive_int

#: The bundled models' names (``sorted(mirrorkit.bench.models.MODELS)``, checked by a test),
#: spelled out so that building the CLI imports no Keras or TensorFlow.
MODEL_NAMES = ("cnn", "mlp", "resnet", "transformer")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds `mirrorkit plan`'s flags to `parser`."""
    parser.add_argument("--model", default="resnet", choices=MODEL_NAMES, help="bundled model")
    parser.add_argument(
        "--batch", type=int, default=None, help="per-replica batch (default: the model's)"
    )
    parser.add_argument(
        "--device-mib",
        type=int,
        default=None,
        help="the replica device's memory in MiB (default: this host's RAM)",
    )


def run(args: argparse.Namespace) -> int:
    """Plans the model's memory per replica and prints the plan; returns the exit status.

    `OK` when the plan fits, `FAILED` when it does not, `BAD_ARGUMENTS` (nothing planned)
    for a batch or a device memory that is not a positive integer.
    """
    import numpy as np

    from mirrorkit.bench import models
    from mirrorkit.scale.memory import plan_memory

    spec = models.get(args.model)
    batch = args.batch if args.batch is not None else spec.default_batch
    try:
        positive_int(batch, "--batch")
        positive_int(args.device_mib, "--device-mib", or_none=True, what="a positive integer")
    except ValueError as err:
        print(f"mirrorkit plan: {err}", file=sys.stderr)
        return BAD_ARGUMENTS
    x, y = models.synthetic_example(spec)
    name = args.model
    plan = plan_memory(
        lambda: models.compiled(models.get(name)),
        batch,
        device_bytes=None if args.device_mib is None else args.device_mib * 1024 * 1024,
        example=(np.asarray(x), np.asarray(y)),
    )
    print(f"{name}: {plan}")
    return OK if plan.fits is not False else FAILED
