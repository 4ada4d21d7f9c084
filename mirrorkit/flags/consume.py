"""Turn parsed flags into TensorFlow's and Keras's own objects."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from absl import flags
from absl import logging as absl_logging

from mirrorkit import notices
from mirrorkit.cluster import chief, cluster_info
from mirrorkit.cluster.tf_config import tf_config
from mirrorkit.environment_variables import TF_CONFIG
from mirrorkit.flags.checks import cluster_conflict, combination_problem, given
from mirrorkit.patching import instance

if TYPE_CHECKING:
    import keras
    import tensorflow as tf


def apply_cluster_flags(flag_values: flags.FlagValues = flags.FLAGS) -> str | None:
    """Writes ``TF_CONFIG`` from ``--worker_hosts``/``--task_index``; returns it (None if unset).

    Raises:
        ValueError: the flags disagree with TF_CONFIG or Slurm, naming both.
    """
    problem = cluster_conflict(flag_values, os.environ)
    if problem:
        raise ValueError(problem)
    hosts = flag_values["worker_hosts"].value
    if not hosts:
        return None
    text = tf_config(hosts, flag_values["task_index"].value or 0)
    if os.environ.get(TF_CONFIG, "").strip():
        return os.environ[TF_CONFIG]  # agrees with the flags (checked above)
    os.environ[TF_CONFIG] = text
    chief.say_once("tf-config-flags", f"TF_CONFIG from --worker_hosts/--task_index: {text}")
    return text


def strategy_from_flags(
    flag_values: flags.FlagValues = flags.FLAGS, *, default_cpu_replicas: int | None = None
) -> tf.distribute.Strategy:
    """Makes the strategy the flags ask for: `mk.strategy` with their values.

    Call it first thing in ``main``: it writes ``TF_CONFIG`` from
    ``--worker_hosts``/``--task_index`` and fixes TensorFlow's devices.

    Args:
        flag_values: the parsed flags.
        default_cpu_replicas: simulate this many CPU replicas when the flags
            choose no devices, no GPU is visible and no cluster is set (said
            once): how an example shows N replicas on a laptop.

    Returns:
        TensorFlow's own `tf.distribute.Strategy`.

    Raises:
        ValueError: contradictory flags (also refused at parse time), flags
            that disagree with TF_CONFIG or Slurm, or what `mk.strategy` refuses.

    Example:
    ```python
    # not run: one line of an absl script; mirrorkit.flags's example is the whole script, run
    strategy = mk_flags.strategy_from_flags()  # python train.py --cpu_replicas 4
    ```
    """
    import mirrorkit as mk

    fv = flag_values
    problem = combination_problem(fv)
    if problem:
        raise ValueError(problem)
    _notices_follow_verbosity()
    apply_cluster_flags(fv)
    num_gpus, cpu_replicas = given(fv, "num_gpus"), given(fv, "cpu_replicas")
    kind = fv["distribution_strategy"].value
    if (
        default_cpu_replicas
        and num_gpus is None
        and cpu_replicas is None
        and kind in ("auto", "mirrored")
        and not cluster_info.from_environment().is_multi_worker
        and not _has_gpus()
    ):
        cpu_replicas = default_cpu_replicas
        chief.say_once(
            "flags-simulated",
            f"no GPU here: {cpu_replicas} simulated replicas on the CPU "
            "(--cpu_replicas N to change)",
        )
    for name in ("bucket_mb", "collective_timeout"):
        if fv[name].value is not None and given(fv, name) is None:
            chief.say_once(
                f"flags-unused-{name}",
                f"this script's default --{name} {fv[name].value:g} is not used: "
                f"--all_reduce_alg {fv['all_reduce_alg'].value} with --distribution_strategy "
                f"{kind} has no {'buckets' if name == 'bucket_mb' else 'timeout'}",
            )
    made = mk.strategy(
        kind,
        num_gpus=num_gpus,
        cpu_replicas=cpu_replicas,
        all_reduce=given(fv, "all_reduce_alg"),
        bucket_mb=given(fv, "bucket_mb"),
        timeout_s=given(fv, "collective_timeout"),
        startup_timeout_s=fv["startup_timeout"].value,
    )
    if fv["num_packs"].value is not None:
        set_num_packs(made, fv["all_reduce_alg"].value, fv["num_packs"].value)
    return made


def _has_gpus() -> bool:
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))


def set_num_packs(strategy: tf.distribute.Strategy, all_reduce_alg: str, num_packs: int) -> None:
    """Gives a MirroredStrategy's NCCL or hierarchical-copy op `num_packs` packs.

    TensorFlow takes ``num_packs`` only in the op's constructor, and
    `mk.strategy` makes the op; this replaces it with an equal op of
    `num_packs` packs, before the strategy's first use.

    Args:
        strategy: a MirroredStrategy made with ``all_reduce=all_reduce_alg``.
        all_reduce_alg: ``"nccl"`` or ``"hierarchical_copy"``.
        num_packs: packs to split the gradients into (>= 1).

    Raises:
        InternalChangedError: the strategy holds no op of that kind.
    """
    import tensorflow as tf

    from mirrorkit import internals

    name = "MirroredStrategy.extended._cross_device_ops"
    ops = internals.require(
        strategy.extended, "_cross_device_ops", name=name, used_for="--num_packs"
    )
    make = {
        "nccl": tf.distribute.NcclAllReduce,
        "hierarchical_copy": tf.distribute.HierarchicalCopyAllReduce,
    }[all_reduce_alg]
    if not isinstance(ops, make):
        raise internals.changed(
            name, "--num_packs", f"it is {type(ops).__name__}, not the {make.__name__} expected"
        )
    instance.set_on(
        strategy.extended,
        "_cross_device_ops",
        make(num_packs=num_packs),
        name="flags.num_packs",
        reason="the --num_packs flag (the strategy was made before the flag was read)",
    )


def batch_size_kwargs(
    flag_values: flags.FlagValues = flags.FLAGS, **script_default: int
) -> dict[str, int]:
    """The batch-size argument of `mk.distribute`: the flag given, else the script's default.

    Args:
        flag_values: the parsed flags.
        **script_default: ``global_batch_size=`` or ``per_replica_batch_size=``,
            used when neither ``--batch_size`` nor ``--per_replica_batch_size``
            has a value.

    Returns:
        ``{"global_batch_size": n}`` or ``{"per_replica_batch_size": n}``.

    Raises:
        ValueError: neither the flags nor the script give a batch size.
    """
    for key, flag in (
        ("global_batch_size", "batch_size"),
        ("per_replica_batch_size", "per_replica_batch_size"),
    ):
        if given(flag_values, flag) is not None:
            return {key: given(flag_values, flag)}
    chosen = {k: v for k, v in script_default.items() if v is not None}
    if len(chosen) != 1:
        raise ValueError(
            "no batch size: give --batch_size (global) or --per_replica_batch_size, or pass "
            "one default (global_batch_size= or per_replica_batch_size=)"
        )
    return chosen


def distribute_from_flags(
    data: Any,
    strategy: tf.distribute.Strategy | None = None,
    flag_values: flags.FlagValues = flags.FLAGS,
    **kwargs: Any,
) -> tf.distribute.DistributedDataset:
    """`mk.distribute(data, strategy, ...)` with the batch size the flags give.

    Args:
        data: what `mk.distribute` takes.
        strategy: the strategy; the current one when None.
        flag_values: the parsed flags.
        **kwargs: further `mk.distribute` arguments. A ``global_batch_size`` or
            ``per_replica_batch_size`` here is the script's default, used only
            when neither ``--batch_size`` nor ``--per_replica_batch_size`` is set.

    Returns:
        TensorFlow's own `tf.distribute.DistributedDataset`.

    Example:
    ```python
    # not run: one line of an absl script; mirrorkit.flags's example is the whole script, run
    train = mk_flags.distribute_from_flags((x, y), strategy, per_replica_batch_size=32)
    ```
    """
    import mirrorkit as mk

    default = {
        key: kwargs.pop(key, None) for key in ("global_batch_size", "per_replica_batch_size")
    }
    return mk.distribute(data, strategy, **batch_size_kwargs(flag_values, **default), **kwargs)


def build_from_flags(
    model_fn: Callable[[], keras.Model],
    strategy: tf.distribute.Strategy | None = None,
    flag_values: flags.FlagValues = flags.FLAGS,
) -> keras.Model:
    """`mk.build` with ``--mixed_precision``, ``--gradient_compression`` and ``--step_logs``.

    ``--mixed_precision`` sets Keras's global dtype policy (said once) before
    ``model_fn`` runs, so the layers it builds compute in 16 bits and keep
    float32 weights; the policy stays set for the rest of the process.

    Args:
        model_fn: a function of no arguments returning a compiled `keras.Model`.
        strategy: the strategy; the current one when None.
        flag_values: the parsed flags.

    Returns:
        The `keras.Model` that ``model_fn`` returned.

    Example:
    ```python
    # not run: one line of an absl script; mirrorkit.flags's example is the whole script, run
    model = mk_flags.build_from_flags(make_model, strategy)
    ```
    """
    import keras

    import mirrorkit as mk

    policy = flag_values["mixed_precision"].value
    if policy != "off":
        keras.mixed_precision.set_global_policy(policy)
        chief.say_once(f"policy-{policy}", f"--mixed_precision: Keras dtype policy {policy}")
    compression = flag_values["gradient_compression"].value
    return mk.build(
        model_fn,
        strategy,
        gradient_compression=None if compression == "none" else compression,
        step_logs=flag_values["step_logs"].value,
    )


def callbacks_from_flags(
    flag_values: flags.FlagValues = flags.FLAGS, **throughput_kwargs: Any
) -> list[keras.callbacks.Callback]:
    """``[mk.ThroughputCallback(json_path=<--throughput_json>, **throughput_kwargs)]``.

    Example:
    ```python
    # not run: one line of an absl script; mirrorkit.flags's example is the whole script, run
    model.fit(train, epochs=3, callbacks=mk_flags.callbacks_from_flags(warmup_steps=5))
    ```
    """
    import mirrorkit as mk

    json_path = flag_values["throughput_json"].value
    return [mk.ThroughputCallback(json_path=json_path, **throughput_kwargs)]


def _notices_follow_verbosity() -> None:
    """The notices follow an absl ``--verbosity`` given on the command line.

    ``-1``: warnings only. A level the script set on the ``"mirrorkit"`` logger stays.
    """
    if "verbosity" in flags.FLAGS and flags.FLAGS["verbosity"].present:
        level = absl_logging.converter.absl_to_standard(absl_logging.get_verbosity())
        notices.follow_verbosity(level)
