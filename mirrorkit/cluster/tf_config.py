"""TF_CONFIG values for the workers of a launch."""

from __future__ import annotations

import json
from collections.abc import Sequence

from mirrorkit.environment_variables import MIRRORKIT_WORKER, TF_CONFIG
from mirrorkit.launcher.ports import free_ports


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
    return json.dumps(
        {"cluster": {"worker": list(addresses)}, "task": {"type": "worker", "index": index}}
    )


def worker_env(addresses: Sequence[str], index: int) -> dict[str, str]:
    """Returns the environment variables mirrorkit gives worker `index` of a launch."""
    return {TF_CONFIG: tf_config(addresses, index), MIRRORKIT_WORKER: str(index)}


def local_addresses(num_workers: int, host: str = "127.0.0.1") -> list[str]:
    """Returns `num_workers` loopback addresses with free ports."""
    return [f"{host}:{port}" for port in free_ports(num_workers, host)]
