"""TF_CONFIG, written: the one writer (the launchers, `mirrorkit.flags`, the raw benchmark job).

`mirrorkit.cluster.cluster_info` is its reader.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from mirrorkit.environment_variables import MIRRORKIT_WORKER, TF_CONFIG


def tf_config(addresses: Sequence[str], index: int) -> str:
    """Returns the TF_CONFIG of worker `index` in a cluster of `addresses`.

    Args:
        addresses: ``host:port`` of every worker, in rank order.
        index: this worker's rank.

    Returns:
        The JSON text for the ``TF_CONFIG`` environment variable.

    Example:
    ```python
    import json

    from mirrorkit.cluster.tf_config import tf_config

    config = json.loads(tf_config(["127.0.0.1:2222", "127.0.0.1:2223"], 1))
    assert config["task"] == {"type": "worker", "index": 1}
    ```
    """
    return for_task({"worker": list(addresses)}, "worker", index)


def for_task(cluster: Mapping[str, Sequence[str]], task_type: str, index: int) -> str:
    """Returns the TF_CONFIG of task `index` of type `task_type` in `cluster`.

    Args:
        cluster: each job type's ``host:port`` addresses, e.g. ``{"chief": [...],
            "worker": [...]}``.
        task_type: this task's job type, a key of `cluster`.
        index: this task's index within its job type.

    Returns:
        The JSON text for the ``TF_CONFIG`` environment variable.

    Raises:
        ValueError: `task_type` is not in `cluster`, or `index` is not one of its tasks.

    Example:
    ```python
    import json

    from mirrorkit.cluster.tf_config import for_task

    cluster = {"chief": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223"]}
    assert json.loads(for_task(cluster, "worker", 0))["task"] == {"type": "worker", "index": 0}
    ```
    """
    tasks = cluster.get(task_type)
    if tasks is None or not 0 <= index < len(tasks):
        raise ValueError(
            f"TF_CONFIG task {task_type!r} {index} is not in the cluster {dict(cluster)!r}; "
            "give a job type of the cluster and an index below its number of addresses"
        )
    return json.dumps(
        {
            "cluster": {job: list(addresses) for job, addresses in cluster.items()},
            "task": {"type": task_type, "index": index},
        }
    )


def worker_env(addresses: Sequence[str], index: int) -> dict[str, str]:
    """Returns the environment variables mirrorkit gives worker `index` of a launch."""
    return {TF_CONFIG: tf_config(addresses, index), MIRRORKIT_WORKER: str(index)}
