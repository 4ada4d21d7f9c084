"""`mirrorkit bench`: the command line, the printed table, and the JSON and PNG it writes."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from typing import Any

from mirrorkit.bench.results import format_table, format_verdicts, plot
from mirrorkit.exit_statuses import BAD_ARGUMENTS, OK

#: The bundled models (`mirrorkit.bench.models.MODELS`), named here so that
#: building the command line imports no TensorFlow.
MODEL_NAMES = ("cnn", "mlp", "resnet", "transformer")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds `mirrorkit bench`'s flags to `parser`."""
    parser.add_argument(
        "--model", default="cnn",
        help=f"a bundled model ({', '.join(MODEL_NAMES)}), or yours: module:function or "
        "path/to/file.py:function returning a compiled Keras model",
    )  # fmt: skip
    parser.add_argument(
        "--data", default=None,
        help="with a model of yours: module:function returning a tf.data.Dataset of single "
        "(x, y) examples (default: random inputs of the model's shapes, zero labels)",
    )  # fmt: skip
    parser.add_argument(
        "--replicas", default="1,2", help="replica counts to sweep in one process (default 1,2)"
    )
    parser.add_argument(
        "--workers", default="1", help="local worker counts to sweep, one replica each (e.g. 1,2)"
    )
    parser.add_argument(
        "--batch-size", type=int, default=None, help="per-replica batch (default: the model's)"
    )
    parser.add_argument("--steps", type=int, default=50, help="timed steps per repeat")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats; medians reported")
    parser.add_argument(
        "--rounds", type=int, default=1,
        help="run every configuration this many times, alternating, and report medians: "
        "side-by-side ratios on a machine whose speed drifts",
    )  # fmt: skip
    parser.add_argument("--out", default=None, help="directory for JSON and PNG results")
    parser.add_argument(
        "--no-pin",
        dest="pin",
        action="store_false",
        help="do not pin the workers of multi-worker runs (the 1-worker baseline stays pinned)",
    )
    parser.add_argument(
        "--cores-per-worker", type=int, default=None,
        help="cores per pinned worker (default: this machine's cores / most workers)",
    )  # fmt: skip
    parser.add_argument(
        "--compression", choices=("fp16", "bf16"), default=None,
        help="all-reduce gradients in 16 bits (mk.build(gradient_compression=...))",
    )  # fmt: skip
    parser.add_argument(
        "--bucket-mb", type=float, default=None,
        help="gradient packing: all-reduce in buckets of this many MB (mk.strategy(bucket_mb=))",
    )  # fmt: skip
    parser.add_argument(
        "--step-logs", choices=("averaged", "local"), default="averaged",
        help="per-step logs averaged over every worker (a collective each step) or this "
        "worker's own (mk.build(step_logs=...))",
    )  # fmt: skip
    parser.add_argument(
        "--allreduce", action="store_true",
        help="also measure all-reduce latency and bus bandwidth, 4 KB to 64 MB, between workers",
    )  # fmt: skip
    parser.add_argument(
        "--compare-raw", action="store_true",
        help="also time hand-written tf.distribute + Keras against mirrorkit, A/B in one run",
    )  # fmt: skip
    parser.add_argument(
        "--input-pipeline", action="store_true",
        help="also compare the CNN fed from a tfds image dataset on disk through mk.distribute "
        "(decode, crop, flip) with in-memory tensors, A/B in one run",
    )  # fmt: skip
    parser.add_argument(
        "--callback-overhead", action="store_true",
        help="also time mirrorkit with and without ThroughputCallback, A/B in one run",
    )  # fmt: skip


def _yours(args: argparse.Namespace) -> bool:
    """Whether --model names a model of yours; checks it (and --data) imports.

    Raises:
        ValueError: an unknown bundled name, a function that does not import, --data
            without a model of yours, or an A/B comparison asked of a model of yours.
    """
    from mirrorkit.bench import user_model

    if args.model in MODEL_NAMES:
        if args.data is not None:
            raise ValueError("--data goes with a model of yours (--model module:function)")
        return False
    if ":" not in args.model:
        raise ValueError(
            f"unknown --model {args.model!r}: choose one of {', '.join(MODEL_NAMES)}, or give "
            "yours as module:function (or path/to/file.py:function)"
        )
    extras = [f for f in ("compare_raw", "input_pipeline", "callback_overhead") if getattr(args, f)]
    if extras:
        flags = ", ".join("--" + f.replace("_", "-") for f in extras)
        raise ValueError(f"{flags} compare(s) a bundled model; drop it with --model {args.model}")
    make_model = user_model.load(args.model)
    make_data = None if args.data is None else user_model.load(args.data, "--data")
    try:
        user_model.check(make_model, make_data)
    except TypeError as err:
        raise ValueError(str(err)) from err
    return True


def _file_name(model: str) -> str:
    """A file-name part for `model`: its name, or a model of yours' function name."""
    return model.rpartition(":")[2] if ":" in model else model


def _counts(text: str, flag: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated counts like 1,2,4; got {text!r}") from None
    if not counts or min(counts) < 1:
        raise ValueError(f"{flag} counts must be positive; got {text!r}")
    return counts


def run(args: argparse.Namespace) -> int:
    """Runs the benchmark described by parsed `args`; returns the exit code."""
    from mirrorkit.bench import models, sweep, user_model

    try:
        replicas = _counts(args.replicas, "--replicas")
        workers = _counts(args.workers, "--workers")
        if args.steps < 1 or args.repeats < 1 or args.rounds < 1:
            raise ValueError("--steps, --repeats and --rounds must be at least 1")
        yours = _yours(args)
    except ValueError as err:
        print(f"mirrorkit bench: {err}", file=sys.stderr)
        return BAD_ARGUMENTS
    if yours:
        batch = args.batch_size or user_model.DEFAULT_BATCH
    else:
        batch = args.batch_size or models.get(args.model).default_batch
    progress = sweep.stderr_progress
    started = time.time()
    results: dict[str, Any] = {
        "model": args.model,
        "per_replica_batch_size": batch,
        "steps": args.steps,
        "repeats": args.repeats,
        "rounds": args.rounds,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "command": "mirrorkit bench " + " ".join(args.argv),
    }
    results["results"] = sweep.scaling(
        args.model, replicas, workers, batch, args.steps, args.repeats,
        pin=args.pin, cores_per_worker=args.cores_per_worker,
        compression=args.compression, bucket_mb=args.bucket_mb, rounds=args.rounds,
        step_logs=args.step_logs, raw=args.compare_raw,
        progress=progress, data=args.data,
    )  # fmt: skip
    print(format_table(results["results"]))
    print(format_verdicts(results["results"]))
    if args.compare_raw and max(workers) > 1:
        results["compare_raw_workers"] = raw_workers_summary(results["results"])
        print(format_raw_workers(results["compare_raw_workers"]))
    if args.compare_raw:
        progress(f"A/B: hand-written tf.distribute + Keras vs mirrorkit, {max(replicas)} replicas")
        ab = sweep.compare(args.model, max(replicas), batch, args.steps, args.repeats, "raw")
        results["compare_raw"] = ab
        raw_ms, mk_ms = ab["step_time_a_s"] * 1000, ab["step_time_b_s"] * 1000
        print(
            f"mirrorkit/raw step-time ratio: {ab['ratio_b_over_a']:.3f} "
            f"(raw {raw_ms:.1f} ms, mirrorkit {mk_ms:.1f} ms per step)"
        )
    if args.callback_overhead:
        progress("A/B: mirrorkit without vs with ThroughputCallback")
        ab = sweep.compare(args.model, max(replicas), batch, args.steps, args.repeats, "callback")
        results["callback_overhead"] = ab
        print(f"ThroughputCallback overhead: {(ab['ratio_b_over_a'] - 1) * 100:+.2f}% of step time")
    if args.input_pipeline:
        from mirrorkit.bench import input_pipeline

        progress(f"A/B: tfds images on disk vs in-memory tensors, {max(replicas)} replicas")
        result = sweep.run_config(input_pipeline.compare, (max(replicas), batch, args.repeats))[0]
        results["input_pipeline"] = result
        print(
            f"input pipeline: tfds {result['tfds_examples_per_sec']:,.1f} examples/s, in memory "
            f"{result['in_memory_examples_per_sec']:,.1f} examples/s, ratio {result['ratio']:.3f}"
        )
    if args.allreduce:
        results["allreduce"] = sweep.allreduce(max(2, max(workers)), max(args.repeats, 5), progress)
        print(format_allreduce(results["allreduce"]))
    results["seconds"] = time.time() - started
    out = args.out or os.path.join(os.getcwd(), "mirrorkit-bench")
    os.makedirs(out, exist_ok=True)
    name = _file_name(args.model)
    json_path = os.path.join(out, f"bench-{name}.json")
    with open(json_path, "w") as f:
        json.dump(results, f, indent=2)
    print(f"results: {json_path}")
    png = plot(results, os.path.join(out, f"bench-{name}.png"))
    if png:
        print(f"plot: {png}")
    return OK


def raw_workers_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Both weak-scaling efficiencies of the most workers: mirrorkit launch's and the raw job's."""
    from mirrorkit.bench import measure

    most = max(r["workers"] for r in rows)
    mk_row = next(r for r in rows if r["workers"] == most and r["launcher"] == "mirrorkit")
    raw_row = next(r for r in rows if r["workers"] == most and r["launcher"] == "raw")
    return {
        "workers": most,
        "mirrorkit_efficiency": mk_row["scaling_efficiency"],
        "raw_efficiency": raw_row["scaling_efficiency"],
        "mirrorkit_examples_per_sec": mk_row["examples_per_sec"],
        "raw_examples_per_sec": raw_row["examples_per_sec"],
        "raw_how": measure.RAW_WORKERS_HOW,
    }


def format_raw_workers(summary: dict[str, Any]) -> str:
    """Two lines: both efficiencies side by side, and how the raw job was written."""
    mk_eff, raw_eff = summary["mirrorkit_efficiency"], summary["raw_efficiency"]
    return (
        f"{summary['workers']} workers, weak-scaling efficiency: mirrorkit launch "
        f"{mk_eff:.3f} vs raw {raw_eff:.3f} ({summary['mirrorkit_examples_per_sec']:,.1f} vs "
        f"{summary['raw_examples_per_sec']:,.1f} examples/s)\n({summary['raw_how']})"
    )


def format_allreduce(result: dict[str, Any]) -> str:
    """The all-reduce table, with this machine's memcpy bandwidth for scale."""
    lines = [f"all-reduce between {result['workers']} workers (float32, SUM)"]
    lines.append(f"{'size':>8}  {'latency ms':>10}  {'algbw GB/s':>10}  {'busbw GB/s':>10}")
    for row in result["rows"]:
        size = row["bytes"]
        label = f"{size // 2**20} MB" if size >= 2**20 else f"{size // 2**10} KB"
        lines.append(
            f"{label:>8}  {row['latency_s'] * 1000:>10.3f}  "
            f"{row['algbw_bytes_per_s'] / 1e9:>10.3f}  {row['busbw_bytes_per_s'] / 1e9:>10.3f}"
        )
    lines.append(f"memcpy bandwidth on this machine: {result['memcpy_bytes_per_s'] / 1e9:.2f} GB/s")
    return "\n".join(lines)
