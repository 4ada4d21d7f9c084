"""The flags themselves: names, defaults, help text, and their start-up checks."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

from absl import flags

from mirrorkit.flags.checks import (
    _EXCLUSIVE,
    ALL_REDUCE_ALGS,
    CHECKS,
    KINDS,
    MIXED_PRECISION,
    cluster_conflict,
)


def define_flags(flag_values: flags.FlagValues = flags.FLAGS, **defaults: Any) -> None:
    """Defines mirrorkit's data-parallel flags and their start-up checks.

    The flags become key flags of the calling module, so the script's
    ``--help`` lists them with their help text.

    Args:
        flag_values: where to define them; absl's global ``FLAGS`` by default.
        **defaults: the script's own defaults, by flag name, e.g.
            ``per_replica_batch_size=32``. A flag the user gives beats another
            flag's default: ``--batch_size 256`` replaces a default
            ``per_replica_batch_size``; both given by the user is an error.

    Raises:
        ValueError: a default names no mirrorkit flag.

    Example:
    ```python
    from absl import flags
    from mirrorkit import flags as mk_flags

    mk_flags.define_flags(per_replica_batch_size=32, bucket_mb=25)
    ```
    """
    unknown = sorted(set(defaults) - set(FLAG_NAMES))
    if unknown:
        raise ValueError(
            f"define_flags() got defaults for {', '.join(unknown)}, which are not mirrorkit "
            f"flags; valid names are {', '.join(FLAG_NAMES)}"
        )
    module = _calling_module()
    for definer, name, default, help_text, extra in _DEFINITIONS:
        definer(name, default, help=help_text, flag_values=flag_values, module_name=module, **extra)
    for name, value in defaults.items():
        flag_values.set_default(name, value)
    _check_default_pairs(flag_values)
    _register_validators(flag_values)


_ENUM = flags.DEFINE_enum
_INT = flags.DEFINE_integer
_NOCASE = {"case_sensitive": False}
_DEFINITIONS = (
    (_ENUM, "distribution_strategy", "auto",
     "mk.strategy kind: 'auto' picks multi_worker when TF_CONFIG or Slurm names several workers, "
     "else mirrored over 2+ GPUs or --cpu_replicas, else one device; 'mirrored' is "
     "MirroredStrategy on this machine; 'multi_worker' (= multi_worker_mirrored) "
     "MultiWorkerMirroredStrategy; 'one_device'; 'default' (= off) no distribution.",
     {"enum_values": KINDS, **_NOCASE}),
    (_INT, "num_gpus", None,
     "Use the first N GPUs of this machine (of each worker, under multi_worker); default: all. "
     "0 runs on the CPU. Excludes --cpu_replicas.",
     {"lower_bound": 0}),
    (_INT, "cpu_replicas", None,
     "Split the CPU into N logical devices, one replica each (simulated replicas on a machine "
     "without GPUs). Excludes --num_gpus.",
     {"lower_bound": 1}),
    (_ENUM, "all_reduce_alg", "auto",
     "How gradients are averaged: 'auto' (collective all-reduce: NCCL on GPUs, ring on CPUs), "
     "'ring', 'nccl' (GPUs), 'hierarchical_copy' (GPUs, one host), 'reduce_to_one' (one host). "
     "Compare them with `mirrorkit bench --allreduce`.",
     {"enum_values": ALL_REDUCE_ALGS, **_NOCASE}),
    (_INT, "num_packs", None,
     "Split the gradients into N packs for --all_reduce_alg nccl or hierarchical_copy (one "
     "host); the collective all-reduce packs by size with --bucket_mb instead.",
     {"lower_bound": 1}),
    (flags.DEFINE_float, "bucket_mb", None,
     "Pack gradients into all-reduce buckets of this many MB (PyTorch DDP's default is 25) so "
     "all-reduce starts before the backward pass ends; collective all-reduce only.",
     {}),
    (flags.DEFINE_float, "collective_timeout", None,
     "Abort an all-reduce that waits longer than this many seconds for its peers "
     "(mk.strategy timeout_s); collective all-reduce only.",
     {}),
    (flags.DEFINE_float, "startup_timeout", 600.0,
     "Seconds a multi-worker job waits for all its workers to start before it stops with an "
     "error naming the missing ones (mk.strategy startup_timeout_s).",
     {}),
    (flags.DEFINE_list, "worker_hosts", None,
     "Comma-separated host:port of every worker, chief first, the same on every worker; with "
     "--task_index it makes this process's TF_CONFIG. Must agree with TF_CONFIG or Slurm when "
     "those are set.",
     {}),
    (_INT, "task_index", None,
     "This worker's index in --worker_hosts (0 is the chief). Needs --worker_hosts.",
     {"lower_bound": 0}),
    (_INT, "batch_size", None,
     "GLOBAL batch size: examples per step over all replicas and workers (Model Garden's "
     "meaning); the replicas must divide it. Excludes --per_replica_batch_size.",
     {"lower_bound": 1}),
    (_INT, "per_replica_batch_size", None,
     "Examples per replica per step; the global batch is this times the replicas. Excludes "
     "--batch_size.",
     {"lower_bound": 1}),
    (_ENUM, "gradient_compression", "none",
     "All-reduce float32 gradients in 16 bits, 'fp16' or 'bf16' (half the bytes, less "
     "precision); 'none' keeps float32.",
     {"enum_values": ("none", "fp16", "bf16"), **_NOCASE}),
    (_ENUM, "mixed_precision", "off",
     "Keras global dtype policy, set before the model is built: 'mixed_float16' (GPUs; compile "
     "adds loss scaling), 'mixed_bfloat16' (TPUs, recent CPUs and GPUs), 'off' (float32).",
     {"enum_values": MIXED_PRECISION, **_NOCASE}),
    (flags.DEFINE_string, "throughput_json", None,
     "Write the throughput report (examples/s per replica and worker, step-time percentiles) "
     "as JSON to this path, on the chief.",
     {}),
    (_ENUM, "step_logs", "averaged",
     "Per-step logs (progress bar): 'averaged' over every replica, or 'local' to this worker's "
     "replicas, sparing a cross-worker collective per step (epoch logs stay averaged).",
     {"enum_values": ("averaged", "local"), **_NOCASE}),
)  # fmt: skip
FLAG_NAMES = tuple(d[1] for d in _DEFINITIONS)


def _calling_module() -> str:
    """The module that called define_flags, named as absl names it (the script's path)."""
    name = sys._getframe(2).f_globals.get("__name__", "__main__")
    return sys.argv[0] if name == "__main__" else name


def _check_default_pairs(fv: flags.FlagValues) -> None:
    for a, b in _EXCLUSIVE:
        if fv[a].default is not None and fv[b].default is not None:
            raise ValueError(
                f"define_flags() got defaults for both {a} and {b}, which exclude each other; "
                "give a default for one of them"
            )


def _register_validators(fv: flags.FlagValues) -> None:
    for name, what in (
        ("bucket_mb", "megabytes"),
        ("collective_timeout", "seconds"),
        ("startup_timeout", "seconds"),
    ):
        flags.register_validator(
            name,
            lambda v: v is None or v > 0,
            message=f"--{name} must be a positive number of {what}",
            flag_values=fv,
        )
    for names, check in CHECKS:
        flags.register_multi_flags_validator(
            list(names), functools.partial(_raise_problem, check, fv), flag_values=fv
        )
    flags.register_multi_flags_validator(
        ["worker_hosts", "task_index"],
        functools.partial(_raise_problem, lambda f: cluster_conflict(f, os.environ), fv),
        flag_values=fv,
    )


def _raise_problem(check: Callable, fv: flags.FlagValues, _values: dict) -> bool:
    problem = check(fv)
    if problem:
        raise flags.ValidationError(problem)
    return True
