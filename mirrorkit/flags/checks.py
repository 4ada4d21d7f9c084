"""Which flag combinations contradict each other, or the cluster TF_CONFIG or Slurm describes.

Reads flags and the environment only; never imports TensorFlow.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from absl import flags

from mirrorkit.cluster import cluster_info
from mirrorkit.environment_variables import TF_CONFIG
from mirrorkit.strategies import rules

#: ``--distribution_strategy`` values: mk.strategy's kinds, each followed by its aliases.
KINDS = tuple(
    name
    for kind in rules.KINDS
    for name in (kind, *[alias for alias, target in rules.ALIASES.items() if target == kind])
)
#: ``--all_reduce_alg`` values (`mirrorkit.strategies.rules`).
ALL_REDUCE_ALGS = rules.ALL_REDUCE_CHOICES
MIXED_PRECISION = ("off", "mixed_float16", "mixed_bfloat16")
#: Pairs of flags of which the user may give one; the given one beats the other's default.
_EXCLUSIVE = (("batch_size", "per_replica_batch_size"), ("cpu_replicas", "num_gpus"))
_COLLECTIVE_ONLY = ("bucket_mb", "collective_timeout")
_WHAT = {"batch_size": "batch size", "cpu_replicas": "replica devices"}


def _single_replica(kind: str) -> bool:
    return rules.normalize_kind(kind) in rules.SINGLE_REPLICA


def _multi_worker_kind(kind: str) -> bool:
    return rules.normalize_kind(kind) == "multi_worker"


def given(fv: flags.FlagValues, name: str) -> Any:
    """The value a flag takes effect with: the user's, else the script's default where it applies.

    A default gives way to another flag the user gave: ``--batch_size`` replaces a
    default ``per_replica_batch_size``, and a default ``bucket_mb`` or
    ``collective_timeout`` is not used where the chosen all-reduce has none, nor a
    default ``all_reduce_alg`` with one replica.
    """
    flag = fv[name]
    if flag.present or flag.value is None:
        return flag.value
    for pair in _EXCLUSIVE:
        if name in pair and fv[pair[1 - pair.index(name)]].present:
            return None
    if name in _COLLECTIVE_ONLY and not collective_runs(fv):
        return None
    if name == "all_reduce_alg" and _single_replica(fv["distribution_strategy"].value):
        return "auto"  # one replica: nothing to all-reduce
    return flag.value


def collective_runs(fv: flags.FlagValues) -> bool:
    """Whether the flags choose TensorFlow's collective all-reduce (buckets and a timeout)."""
    kind, alg = fv["distribution_strategy"].value, fv["all_reduce_alg"].value
    if _single_replica(kind):
        return False
    across_workers = (
        _multi_worker_kind(kind)
        or len(fv["worker_hosts"].value or ()) > 1
        or (kind == "auto" and _env_multi_worker())
    )
    return rules.collective(alg, across_workers)


def _env_multi_worker() -> bool:
    try:
        return cluster_info.from_environment().is_multi_worker
    except ValueError:
        return False


def combination_problem(fv: flags.FlagValues = flags.FLAGS) -> str | None:
    """Says what is contradictory among the flags, or None when they fit together.

    Args:
        fv: the parsed flags.

    Returns:
        The first problem found, naming the flags at fault, or None.
    """
    for _, check in CHECKS:
        problem = check(fv)
        if problem:
            return problem
    return None


def _exclusive(fv: flags.FlagValues) -> str | None:
    for a, b in _EXCLUSIVE:
        if fv[a].present and fv[b].present:
            return f"--{a} and --{b} both set the {_WHAT[a]}; give only one of them"
    return None


def _hosts(fv: flags.FlagValues) -> str | None:
    hosts, index = fv["worker_hosts"].value, fv["task_index"].value
    kind = fv["distribution_strategy"].value
    if index is not None and not hosts:
        return "--task_index needs --worker_hosts (the host:port of every worker)"
    if not hosts:
        return None
    for position, address in enumerate(hosts, 1):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            return (
                f"--worker_hosts entry {position} ({address!r}) must be host:port with a port in "
                "1..65535, e.g. --worker_hosts 10.0.0.1:2222,10.0.0.2:2222"
            )
    if index is not None and index >= len(hosts):
        return (
            f"--task_index {index} is out of range: --worker_hosts names {len(hosts)} worker(s), "
            f"indices 0..{len(hosts) - 1}"
        )
    if len(hosts) > 1 and index is None:
        return f"--worker_hosts names {len(hosts)} workers; --task_index must say which this is"
    if len(hosts) > 1 and kind != "auto" and not _multi_worker_kind(kind):
        return (
            f"--worker_hosts names {len(hosts)} workers, but --distribution_strategy {kind} "
            "runs on one machine; use auto or multi_worker"
        )
    return None


def _packs(fv: flags.FlagValues) -> str | None:
    if fv["num_packs"].value is None:
        return None
    alg, kind = fv["all_reduce_alg"].value, fv["distribution_strategy"].value
    if alg not in rules.PACKED:
        return (
            f"--num_packs applies to --all_reduce_alg nccl or hierarchical_copy, not "
            f"--all_reduce_alg {alg} (the collective all-reduce packs by size: use --bucket_mb)"
        )
    if _multi_worker_kind(kind) or len(fv["worker_hosts"].value or ()) > 1:
        return "--num_packs is for one host; across workers use --bucket_mb"
    return None


def _collective(fv: flags.FlagValues) -> str | None:
    alg = fv["all_reduce_alg"].value
    used = [n for n in _COLLECTIVE_ONLY if given(fv, n) is not None]
    if used and not _single_replica(fv["distribution_strategy"].value) and not collective_runs(fv):
        return (
            f"--{used[0]} applies to the collective all-reduce (--all_reduce_alg auto, ring, or "
            f"nccl across workers); --all_reduce_alg {alg} has no buckets and no timeout"
        )
    return None


def _multi_worker(fv: flags.FlagValues) -> str | None:
    kind, alg = fv["distribution_strategy"].value, fv["all_reduce_alg"].value
    if not _multi_worker_kind(kind):
        return None
    if alg not in rules.MULTI_WORKER_CHOICES:
        return (
            f"--all_reduce_alg {alg} is single-host; --distribution_strategy {kind} takes "
            "auto, ring or nccl"
        )
    if given(fv, "cpu_replicas") is not None:
        return (
            f"--cpu_replicas with --distribution_strategy {kind}: each worker uses its GPUs or "
            "its CPU as one replica; use --num_gpus to limit the GPUs per worker"
        )
    return None


def _one_replica(fv: flags.FlagValues) -> str | None:
    kind = fv["distribution_strategy"].value
    if not _single_replica(kind):
        return None
    replicas = [n for n in ("num_gpus", "cpu_replicas") if given(fv, n) is not None]
    if rules.normalize_kind(kind) == "default" and replicas:
        return f"--{replicas[0]} with --distribution_strategy {kind} (no distribution)"
    many = [n for n in replicas if given(fv, n) > 1]
    if many:
        return (
            f"--{many[0]} {given(fv, many[0])} with --distribution_strategy {kind} "
            "(one replica); use mirrored"
        )
    used = [n for n in _COLLECTIVE_ONLY if given(fv, n) is not None]
    used += ["all_reduce_alg"] if given(fv, "all_reduce_alg") != "auto" else []
    if used:
        return (
            f"--{used[0]} with --distribution_strategy {kind}: one replica has nothing to "
            "all-reduce"
        )
    return None


_STRATEGY = ("distribution_strategy", "all_reduce_alg")
#: Each start-up check and the flags it reads (absl names them in its message).
CHECKS = (
    (("batch_size", "per_replica_batch_size", "cpu_replicas", "num_gpus"), _exclusive),
    (("worker_hosts", "task_index", "distribution_strategy"), _hosts),
    (("num_packs", *_STRATEGY, "worker_hosts"), _packs),
    (("bucket_mb", "collective_timeout", *_STRATEGY, "worker_hosts"), _collective),
    ((*_STRATEGY, "cpu_replicas", "num_gpus"), _multi_worker),
    ((*_STRATEGY, "cpu_replicas", "num_gpus", "bucket_mb", "collective_timeout"), _one_replica),
)


def cluster_conflict(fv: flags.FlagValues, env: Mapping[str, str]) -> str | None:
    """Says where --worker_hosts/--task_index disagree with TF_CONFIG or Slurm, else None."""
    hosts = fv["worker_hosts"].value
    if not hosts:
        return None
    index = fv["task_index"].value or 0
    try:
        outside = cluster_info.from_environment(env)
    except ValueError as err:
        return f"--worker_hosts is set and the environment's cluster is malformed: {err}"
    if outside.source == TF_CONFIG:
        if list(outside.addresses) != list(hosts):
            return (
                f"--worker_hosts {','.join(hosts)} differs from TF_CONFIG's workers "
                f"{','.join(outside.addresses)}; give one of them (unset TF_CONFIG or drop "
                "--worker_hosts)"
            )
        if outside.worker_index != index:
            return (
                f"--task_index {index} differs from TF_CONFIG's task (worker "
                f"{outside.worker_index}); give one of them"
            )
    elif outside.source == "slurm":
        if outside.num_workers != len(hosts) or outside.task_index != index:
            return (
                f"--worker_hosts/--task_index say worker {index} of {len(hosts)}, but Slurm says "
                f"task {outside.task_index} of {outside.num_workers} (its srun step's "
                "SLURM_STEP_* variables); make them agree or drop the flags"
            )
    return None
