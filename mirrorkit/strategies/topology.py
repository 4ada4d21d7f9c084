"""What a strategy spans: `Topology`, `describe()`, and the `auto` rule.

`plan_auto()` decides what ``mk.strategy("auto")`` builds from the environment
and the physical devices alone, so `mirrorkit info` can say which branch it
takes and why without building anything.
"""

from __future__ import annotations

import dataclasses
import os

import tensorflow as tf

from mirrorkit import tables
from mirrorkit.cluster import chief, cluster_info, slurm, workers
from mirrorkit.environment_variables import TF_CONFIG
from mirrorkit.strategies import allreduce, current
from mirrorkit.strategies.devices import compact_devices, short_device


@dataclasses.dataclass(frozen=True)
class Topology:
    """The shape of a distributed job, as one process sees it.

    Attributes:
        kind: the strategy's class name, e.g. ``MirroredStrategy``.
        num_workers: training processes the strategy spans (an ``evaluator``
            task is never counted).
        worker_index: this process's rank among them, numbered as TensorFlow
            does (the ``chief`` task first, then ``worker`` 0, 1, ...); None in
            a task that does not train (an ``evaluator``).
        is_chief: whether this process owns printing, files and TensorBoard.
        num_replicas: replicas in sync across all workers.
        local_devices: this worker's replica devices, e.g. ``("CPU:0", "CPU:1")``.
        all_reduce: the all-reduce that averages gradients.
        task_type: this process's task in TF_CONFIG (``chief``, ``worker``,
            ``evaluator``...); ``worker`` outside a cluster.

    Example:
    ```python
    import mirrorkit as mk

    mk.strategy(cpu_replicas=2)
    print(mk.describe())
    ```
    """

    kind: str
    num_workers: int
    worker_index: int | None
    is_chief: bool
    num_replicas: int
    local_devices: tuple[str, ...]
    all_reduce: str
    task_type: str = "worker"

    @property
    def replicas_per_worker(self) -> int:
        """Replicas on this worker."""
        return len(self.local_devices)

    def summary(self) -> str:
        """One line, e.g. ``MirroredStrategy, 4 replicas on 1 worker (CPU:0-3), ...``."""
        workers = f"{self.num_workers} worker{'s' if self.num_workers != 1 else ''}"
        replicas = f"{self.num_replicas} replica{'s' if self.num_replicas != 1 else ''}"
        devices = compact_devices(self.local_devices)
        each = " each" if self.num_workers > 1 else ""
        return (
            f"{self.kind}, {replicas} on {workers} ({devices}{each}), all-reduce {self.all_reduce}"
        )

    def _rows(self) -> list[tuple[str, str]]:
        return [
            ("strategy", self.kind),
            ("workers", str(self.num_workers)),
            ("this worker", self._this_worker()),
            ("replicas in sync", str(self.num_replicas)),
            ("local devices", ", ".join(self.local_devices)),
            ("all-reduce", self.all_reduce),
        ]

    def _this_worker(self) -> str:
        if self.worker_index is None:
            return f"none: this is the {self.task_type} task, not a training worker"
        return f"{self.worker_index}{' (chief)' if self.is_chief else ''}"

    def __str__(self) -> str:
        return tables.pairs(self._rows())

    def _repr_html_(self) -> str:
        return tables.html_pairs(self._rows(), "mirrorkit-topology")

    def to_dict(self) -> dict:
        """A JSON-ready dict of the fields."""
        return dataclasses.asdict(self) | {"local_devices": list(self.local_devices)}


def describe(strategy: tf.distribute.Strategy | None = None) -> Topology:
    """Describes a strategy's topology.

    Args:
        strategy: a `tf.distribute.Strategy`; None means the strategy in scope,
            else the one `mk.strategy()` made last, else TensorFlow's default.

    Returns:
        A `Topology`.

    Example:
    ```python
    import mirrorkit as mk

    topology = mk.describe(mk.strategy(cpu_replicas=2))
    assert topology.num_replicas == 2
    ```
    """
    if strategy is None:
        strategy = current.current_strategy()
    kind = _PUBLIC_NAMES.get(type(strategy).__name__, type(strategy).__name__)
    here = workers.position(strategy)
    devices = _local_devices(strategy)
    return Topology(
        kind=kind,
        num_workers=here.num_workers,
        worker_index=here.worker_index,
        is_chief=here.is_chief,
        num_replicas=strategy.num_replicas_in_sync,
        local_devices=devices,
        all_reduce=allreduce.describe_ops(strategy),
        task_type=here.task_type,
    )


#: TensorFlow's class names -> the names users write.
_PUBLIC_NAMES = {
    "_DefaultDistributionStrategy": "DefaultStrategy",
    "CollectiveAllReduceStrategy": "MultiWorkerMirroredStrategy",
}


def _local_devices(strategy: tf.distribute.Strategy) -> tuple[str, ...]:
    try:
        return tuple(short_device(d) for d in strategy.extended.worker_devices)
    except RuntimeError:  # the default strategy: TensorFlow's default placement
        gpus = tf.config.list_logical_devices("GPU")
        return (short_device(gpus[0].name) if gpus else "CPU:0",)


@dataclasses.dataclass(frozen=True)
class AutoChoice:
    """What ``kind="auto"`` resolves to here, and why.

    Attributes:
        kind: ``multi_worker``, ``mirrored`` or ``one_device``.
        reason: one sentence naming the rule that fired.
    """

    kind: str
    reason: str


def plan_auto(cpu_replicas: int | None = None, num_gpus: int | None = None) -> AutoChoice:
    """Applies the ``auto`` rule without building a strategy.

    The rule, first match wins:

    1. ``TF_CONFIG`` naming more than one training task (``chief`` and
       ``worker``), this being one of them, or a Slurm step (``srun``) with more
       than one task -> ``multi_worker``. An ``evaluator`` task goes on to the
       local rules; a batch script of a Slurm job of several tasks, outside
       ``srun``, is said to train alone (`mirrorkit.cluster.slurm.outside_step_note`).
    2. two or more GPUs visible (or ``num_gpus`` >= 2) -> ``mirrored`` over them.
    3. ``cpu_replicas`` >= 2 -> ``mirrored`` over that many logical CPUs.
    4. otherwise -> ``one_device`` (GPU:0 if there is one, else CPU:0).

    Args:
        cpu_replicas: the ``cpu_replicas`` a caller asks for, if any.
        num_gpus: the ``num_gpus`` a caller asks for, if any.

    Returns:
        An `AutoChoice`.
    """
    info = cluster_info.from_environment()
    outside = slurm.outside_step_note(os.environ) if info.source == "none" else None
    if outside:
        chief.say_once("slurm-outside-step", outside)
    if info.is_multi_worker:
        where = TF_CONFIG if info.source == TF_CONFIG else "the Slurm step"
        if cpu_replicas is not None and cpu_replicas > 1:
            chief.say_once(
                "cpu-replicas-ignored-multi-worker",
                f"cpu_replicas={cpu_replicas} is ignored: {where} makes this process one of "
                f"{info.num_workers} workers (mirrorkit launch, or a cluster), and each worker "
                "trains one replica on its CPU (its GPUs when it has them). For "
                f"{cpu_replicas} replicas in one process, run the script with python, not "
                "mirrorkit launch",
            )
        return AutoChoice("multi_worker", f"{where} names {info.num_workers} training tasks")
    local = _plan_local(cpu_replicas, num_gpus)
    if not info.is_training_worker:
        return AutoChoice(
            local.kind,
            f"TF_CONFIG names this task '{info.task_type}', not a training worker, so it joins "
            f"no training collective; on its own: {local.reason}",
        )
    return local


def _plan_local(cpu_replicas: int | None, num_gpus: int | None) -> AutoChoice:
    gpus = len(tf.config.list_physical_devices("GPU"))
    wanted_gpus = gpus if num_gpus is None else num_gpus
    if wanted_gpus >= 2:
        return AutoChoice("mirrored", f"{wanted_gpus} GPUs: one replica on each")
    if cpu_replicas is not None and cpu_replicas >= 2:
        return AutoChoice(
            "mirrored", f"cpu_replicas={cpu_replicas}: {cpu_replicas} simulated replicas on the CPU"
        )
    if wanted_gpus == 1:
        return AutoChoice("one_device", "one GPU and no multi-worker cluster: one device")
    return AutoChoice("one_device", "no GPU and no cpu_replicas: one CPU device")
