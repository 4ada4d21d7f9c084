"""Which multi-worker cluster this process belongs to: TF_CONFIG and Slurm.

Reads the environment only; never imports TensorFlow, so it is cheap and safe
before TensorFlow's devices are fixed. Malformed configuration is an error that
names the field at fault.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence

from mirrorkit.cluster import slurm
from mirrorkit.environment_variables import TF_CONFIG

#: Job types a TF_CONFIG may name, and those that count as training workers.
KNOWN_JOBS = ("chief", "worker", "evaluator", "ps")
TRAINING_JOBS = ("chief", "worker")


@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    """Where this process sits in a cluster, as the environment describes it.

    This is the one place mirrorkit computes "which worker am I":
    `worker_index` numbers the training tasks the way TensorFlow does (the
    ``chief`` task first, then ``worker`` 0, 1, ...), and `mk.describe`,
    `mk.is_chief`, `mirrorkit.cluster.workers` and the callbacks all read it.

    Attributes:
        source: ``"TF_CONFIG"``, ``"slurm"`` or ``"none"``.
        num_workers: training tasks in the job (chief plus workers); 1 alone.
            An ``evaluator`` or ``ps`` task is not counted.
        task_type: this task's job type (``"worker"``, ``"chief"``, ``"evaluator"``...).
        task_index: this task's index within its job type.
        is_chief: whether this task owns the job's side effects.
        worker_index: this task's rank among the training tasks, chief first
            (0-based), the rank TensorFlow's collectives use; None for a task
            that does not train (``evaluator``, ``ps``).
        addresses: ``host:port`` of the training tasks, chief first.
    """

    source: str
    num_workers: int
    task_type: str
    task_index: int
    is_chief: bool
    worker_index: int | None
    addresses: tuple[str, ...] = ()

    @property
    def is_multi_worker(self) -> bool:
        """Whether this task is one of several training tasks."""
        return self.num_workers > 1 and self.is_training_worker

    @property
    def is_training_worker(self) -> bool:
        """Whether this task trains (a ``chief`` or ``worker``), unlike an ``evaluator``."""
        return self.worker_index is not None


def from_cluster_spec(
    spec: Mapping[str, Sequence[str]], task_type: str, task_index: int, source: str = TF_CONFIG
) -> ClusterInfo:
    """The `ClusterInfo` of task (`task_type`, `task_index`) in an already valid cluster spec.

    Args:
        spec: job name -> list of ``host:port`` (as in TF_CONFIG's ``cluster``,
            or a cluster resolver's ``cluster_spec().as_dict()``).
        task_type: this task's job type.
        task_index: this task's index within its job type.
        source: where the spec came from (``"TF_CONFIG"`` or ``"slurm"``).

    Returns:
        The `ClusterInfo`, ranks chief first.

    Example:
    ```python
    from mirrorkit.cluster import cluster_info

    spec = {"chief": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223"]}
    assert cluster_info.from_cluster_spec(spec, "worker", 0).worker_index == 1
    ```
    """
    training = [(job, i) for job in TRAINING_JOBS for i in range(len(spec.get(job, [])))]
    me = (task_type, task_index)
    rank = training.index(me) if me in training else None
    return ClusterInfo(
        source=source,
        num_workers=max(1, len(training)),
        task_type=task_type,
        task_index=task_index,
        is_chief=rank == 0,
        worker_index=rank,
        addresses=tuple(spec[job][i] for job, i in training),
    )


def parse_tf_config(text: str) -> ClusterInfo:
    """Parses and validates a TF_CONFIG value.

    Args:
        text: the JSON text of ``TF_CONFIG``.

    Returns:
        The `ClusterInfo` it describes.

    An ``evaluator`` task may be outside ``cluster``, as Vertex AI and AI
    Platform write it (TensorFlow accepts that too); a ``ps`` job is refused:
    parameter servers need ``tf.distribute.ParameterServerStrategy``.

    Raises:
        ValueError: naming the field that is missing or malformed, or the
            parameter-server layout and what to use instead.

    Example:
    ```python
    from mirrorkit.cluster.cluster_info import parse_tf_config

    info = parse_tf_config('{"cluster": {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]}, '
                           '"task": {"type": "worker", "index": 1}}')
    assert (info.num_workers, info.worker_index, info.is_chief) == (2, 1, False)
    ```
    """
    try:
        config = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"TF_CONFIG is not valid JSON ({err}); got {text[:200]!r}") from None
    if not isinstance(config, Mapping):
        raise ValueError(
            f"TF_CONFIG must be a JSON object with 'cluster' and 'task'; got {config!r}"
        )
    spec = config.get("cluster")
    if not isinstance(spec, Mapping) or not spec:
        raise ValueError(
            "TF_CONFIG field 'cluster' must be a non-empty object mapping job names to address "
            f'lists, e.g. {{"worker": ["host1:2222", "host2:2222"]}}; got {spec!r}'
        )
    task = config.get("task")
    if "ps" in spec or (isinstance(task, Mapping) and task.get("type") == "ps"):
        raise ValueError(_PARAMETER_SERVERS)
    for job, addresses in spec.items():
        if job not in KNOWN_JOBS:
            raise ValueError(
                f"TF_CONFIG field 'cluster.{job}' names an unknown job type; "
                f"valid types are {', '.join(KNOWN_JOBS)}"
            )
        if not isinstance(addresses, list) or not addresses:
            raise ValueError(
                f"TF_CONFIG field 'cluster.{job}' must be a non-empty list of 'host:port' "
                f"strings; got {addresses!r}"
            )
        for i, address in enumerate(addresses):
            _check_address(address, f"cluster.{job}[{i}]")
    if spec.get("chief") is not None and len(spec["chief"]) != 1:
        raise ValueError(
            f"TF_CONFIG field 'cluster.chief' must list exactly one address; got {spec['chief']!r}"
        )
    training = [a for job in TRAINING_JOBS for a in spec.get(job, [])]
    if task is None:
        if len(training) > 1:
            raise ValueError(
                "TF_CONFIG has no field 'task'; every process of a multi-worker job must say "
                'which task it is, e.g. {"type": "worker", "index": 0}'
            )
        task = {"type": next(iter(spec)), "index": 0}
    if not isinstance(task, Mapping):
        raise ValueError(f"TF_CONFIG field 'task' must be an object; got {task!r}")
    task_type = task.get("type")
    # Vertex AI and AI Platform leave the evaluator out of 'cluster' (it is no
    # member of the training cluster); TensorFlow accepts that layout too.
    outside = task_type == "evaluator" and task_type not in spec
    if task_type not in spec and not outside:
        raise ValueError(
            f"TF_CONFIG field 'task.type' is {task_type!r}, which is not a job in 'cluster' "
            f"({', '.join(spec)})"
        )
    index = task.get("index", 0)
    if isinstance(index, bool) or not isinstance(index, int):
        raise ValueError(f"TF_CONFIG field 'task.index' must be an integer; got {index!r}")
    if outside:
        if index < 0:
            raise ValueError(f"TF_CONFIG field 'task.index' must be 0 or more; got {index}")
        return from_cluster_spec(spec, task_type, index)
    if not 0 <= index < len(spec[task_type]):
        raise ValueError(
            f"TF_CONFIG field 'task.index' is {index}, but 'cluster.{task_type}' has "
            f"{len(spec[task_type])} address(es): valid indices are 0..{len(spec[task_type]) - 1}"
        )
    return from_cluster_spec(spec, task_type, index)


_PARAMETER_SERVERS = (
    "TF_CONFIG names a 'ps' job: that is a parameter-server layout, which trains with "
    "tf.distribute.ParameterServerStrategy, and mirrorkit trains with synchronous all-reduce "
    "(MultiWorkerMirroredStrategy) only: no 'ps' task ever joins its workers. Drop the "
    "parameter servers (Kubeflow TFJob: the PS replica spec; Vertex AI: worker pool 2; "
    "SageMaker: use distribution={'multi_worker_mirrored_strategy': {'enabled': True}} instead "
    "of 'parameter_server'), or build tf.distribute.ParameterServerStrategy yourself."
)


def _check_address(address: object, field: str) -> None:
    if not isinstance(address, str) or ":" not in address:
        raise ValueError(f"TF_CONFIG field '{field}' must be a 'host:port' string; got {address!r}")
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f"TF_CONFIG field '{field}' must be 'host:port' with a port in 1..65535; "
            f"got {address!r}"
        )


def from_environment(env: Mapping[str, str] | None = None) -> ClusterInfo:
    """Describes the cluster named by TF_CONFIG, else by a Slurm step, else none.

    A Slurm step is one ``srun`` of several tasks, one task per worker: its
    nodes, tasks per node and ports come from the ``SLURM_STEP_*`` variables
    (see `mirrorkit.cluster.slurm`); a batch script outside ``srun`` is no cluster.

    Args:
        env: the environment to read; `os.environ` when None.

    Returns:
        A `ClusterInfo`; a single process reports one worker, index 0, chief.

    Example:
    ```python
    from mirrorkit.cluster.cluster_info import from_environment

    assert from_environment({}).num_workers == 1
    ```
    """
    env = os.environ if env is None else env
    text = env.get(TF_CONFIG, "").strip()
    if text:
        return parse_tf_config(text)
    here = slurm.step(env)  # a task of an srun step of several tasks (mirrorkit.cluster.slurm)
    if here is not None:
        return ClusterInfo(
            source="slurm",
            num_workers=here.num_tasks,
            task_type="worker",
            task_index=here.rank,
            is_chief=here.rank == 0,
            worker_index=here.rank,
            addresses=here.addresses(),
        )
    return ALONE


#: A process outside any cluster: one worker, rank 0, the chief.
ALONE = ClusterInfo(
    source="none", num_workers=1, task_type="worker", task_index=0, is_chief=True, worker_index=0
)
