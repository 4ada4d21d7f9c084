"""One builder per strategy kind, and the TensorFlow internals they set.

Each builder takes the checked arguments of `mk.strategy()` and returns
TensorFlow's own strategy object. The two private internals touched here
(a MirroredStrategy's communication options and its collective key base) are
set in this module only.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable

import tensorflow as tf

from mirrorkit import internals
from mirrorkit.cluster import chief, cluster_info, slurm
from mirrorkit.cluster.workers import every_strategy
from mirrorkit.patching import instance
from mirrorkit.patching.repair import SCOPED_WHILE, Repair, scoped
from mirrorkit.strategies import allreduce
from mirrorkit.strategies import devices as devices_lib


def mirrored(*, devices, num_gpus, cpu_replicas, all_reduce, bucket_mb, timeout_s):
    """`tf.distribute.MirroredStrategy` over explicit devices, N logical CPUs or the GPUs."""
    if devices is None:
        if cpu_replicas is not None:
            devices = tuple(devices_lib.logical("CPU")[:cpu_replicas])
        else:
            devices = tuple(devices_lib.gpus_for(num_gpus)) or ("CPU:0",)
    else:
        devices_lib.check_exist(devices)
    on_gpus = all(d.startswith("GPU") for d in devices)
    plan = allreduce.plan_mirrored(
        all_reduce, on_gpus=on_gpus, bucket_mb=bucket_mb, timeout_s=timeout_s
    )
    made = _with_own_collective_keys(
        lambda: tf.distribute.MirroredStrategy(
            devices=[f"/{d}" for d in devices], cross_device_ops=plan.cross_device_ops
        )
    )
    if plan.options is not None:
        # MirroredStrategy takes no CommunicationOptions in its constructor; its
        # collective all-reduce reads them from this attribute (TF 2.17-2.21).
        name = "MirroredStrategy.extended._communication_options"
        extended = made.extended
        current = internals.require(
            extended, "_communication_options", name=name, used_for="bucket_mb and timeout_s"
        )
        if not hasattr(current, "merge"):
            raise internals.changed(name, "bucket_mb and timeout_s", "it has no merge()")
        instance.set_on(
            extended,
            "_communication_options",
            current.merge(plan.options),
            name="strategy.communication_options",
            reason="mk.strategy's bucket_mb and timeout_s (MirroredStrategy's constructor takes "
            "no CommunicationOptions)",
        )
    return made


#: Collective group keys reserved for each MirroredStrategy mirrorkit makes.
_KEYS_PER_STRATEGY = 100_000
_strategies_made = itertools.count()


def _with_own_collective_keys(make: Callable[[], tf.distribute.MirroredStrategy]):
    """Makes a MirroredStrategy whose collective group keys no earlier one uses.

    Every MirroredStrategy numbers its collective groups from 1, so a second
    strategy with a different replica count in the same process (a notebook
    going from 4 replicas to 2) joins group 1 with the wrong size and fails
    ("is joining a group with size 2, but that group has size 4"). The class
    attribute ``_collective_key_base`` (TF 2.17-2.21) offsets the keys; it is
    set for the construction only; plain MirroredStrategy objects keep base 0.
    """
    cls = tf.distribute.MirroredStrategy
    name = "MirroredStrategy._collective_key_base"
    used_for = "separate collective keys for each MirroredStrategy in a process"
    internals.require(cls, "_collective_key_base", name=name, used_for=used_for)
    base = (next(_strategies_made) + 1) * _KEYS_PER_STRATEGY
    keys = Repair(
        name="collective_key_base",
        upstream=used_for,
        module=cls.__module__,
        target=f"{cls.__name__}._collective_key_base",
        replacement=lambda tf_base: base,
        applies_to=every_strategy,
        when=SCOPED_WHILE,
    )
    with scoped(keys):
        made = make()
        taken = internals.require(
            made.extended,
            "_collective_key_base",
            name="MirroredStrategy.extended._collective_key_base",
            used_for=used_for,
        )
    if taken != base:
        raise internals.changed(name, used_for, "the strategy did not take the base set")
    return made


def multi_worker(*, devices, num_gpus, cpu_replicas, all_reduce, bucket_mb, timeout_s):
    """`tf.distribute.MultiWorkerMirroredStrategy` from TF_CONFIG or a Slurm step.

    Under Slurm, each task sees only its own GPUs (`mirrorkit.cluster.slurm.gpu_share`),
    or its CPU where the node has none, and the cluster is the one
    `mirrorkit.cluster.cluster_info` read from the step's variables.
    """
    info = cluster_info.from_environment()  # validates TF_CONFIG, naming a bad field
    if not info.is_training_worker:
        raise ValueError(
            f"kind='multi_worker' was asked for, but TF_CONFIG names this task "
            f"'{info.task_type}', which is not a training worker: it joins none of the training "
            f"workers' collectives. Use mk.strategy() (kind='auto'), which gives this task a "
            "strategy of its own devices, e.g. to evaluate the checkpoints the workers write."
        )
    if info.source == "slurm":
        _take_slurm_gpus()
    if num_gpus is not None:
        physical = tf.config.get_visible_devices("GPU")
        if num_gpus > len(physical):
            raise ValueError(
                f"num_gpus={num_gpus} was asked for, but this worker has {len(physical)} GPU(s)"
            )
        tf.config.set_visible_devices(physical[:num_gpus], "GPU")
    gpus = len(tf.config.get_visible_devices("GPU"))
    options = allreduce.plan_multi_worker(
        all_reduce, has_gpus=gpus > 0, bucket_mb=bucket_mb, timeout_s=timeout_s
    )
    resolver = None
    if info.source == "slurm":
        # The cluster mirrorkit.cluster.slurm read from the step's variables; never TensorFlow's
        # SlurmClusterResolver, which runs nvidia-smi and scontrol (tensorflow#56894).
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec({"worker": list(info.addresses)}),
            task_type="worker",
            task_id=info.worker_index,
            num_accelerators={"GPU": gpus},
            rpc_layer="grpc",
        )
    elif info.source == "none":
        note = slurm.outside_step_note(os.environ)
        chief.say_once(
            "single-worker-mwms",
            "kind='multi_worker' without TF_CONFIG or Slurm: a multi-worker strategy of one worker"
            + (f". {note}" if note else ""),
        )
    try:
        return tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=resolver, communication_options=options
        )
    except (RuntimeError, ValueError) as err:
        if "startup" in str(err) or "initialized" in str(err) or "initialised" in str(err):
            raise RuntimeError(
                "A multi-worker strategy must be the first TensorFlow work in a process, and "
                "this process has already initialised TensorFlow (or made another multi-worker "
                "strategy with different settings). Make mk.strategy() first thing in the "
                f"script, or restart the kernel. TensorFlow said: {err}"
            ) from err
        raise


def _take_slurm_gpus() -> None:
    """Makes this Slurm task see only its own GPUs (`slurm.gpu_share`), and says so."""
    here = slurm.step(os.environ)
    physical = tf.config.list_physical_devices("GPU")
    share = slurm.gpu_share(here, os.environ, len(physical))
    if len(share) == len(physical):
        return
    tf.config.set_visible_devices([physical[i] for i in share], "GPU")
    chief.say_once(
        "slurm-gpu-share",
        f"Slurm: the step's {here.tasks_here} tasks on {here.hosts[here.node_index]} share "
        f"the {len(physical)} GPUs each sees (no --gpus-per-task); local task j (SLURM_LOCALID) "
        f"trains on the j-th {len(share)} of them (this one: {share.start}-{share.stop - 1})",
    )


def one_device(*, devices, num_gpus, cpu_replicas, all_reduce, bucket_mb, timeout_s):
    """`tf.distribute.OneDeviceStrategy` on the named device, else GPU:0, else CPU:0."""
    if devices:
        devices_lib.check_exist(devices)
        device = devices[0]
    elif num_gpus == 0 or cpu_replicas is not None:
        device = "CPU:0"
    else:
        gpus = devices_lib.gpus_for(num_gpus)
        device = gpus[0] if gpus else "CPU:0"
    return tf.distribute.OneDeviceStrategy(f"/{device}")


def default(**_unused):
    """TensorFlow's default strategy: no distribution."""
    return internals.load(
        "tensorflow.python.distribute.distribute_lib",
        "_get_default_strategy",
        used_for="kind='default'",
    )()


#: kind -> builder; `mk.strategy()` resolves ``auto`` before it looks here.
BUILDERS = {
    "mirrored": mirrored,
    "multi_worker": multi_worker,
    "one_device": one_device,
    "default": default,
}
