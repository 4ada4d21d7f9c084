"""What `mirrorkit info` reports: versions, devices, cluster, and the auto choice."""

from __future__ import annotations

import os
import platform
from typing import Any

from mirrorkit import tables, versions
from mirrorkit.cluster import cluster_info


def collect() -> dict[str, Any]:
    """Gathers the facts `mirrorkit info` prints, as a JSON-ready dict.

    Reads physical devices only, so it does not fix TensorFlow's logical
    devices.

    Returns:
        A dict with ``versions``, ``tested_range`` (whether the installed
        TensorFlow/Keras pair is inside the range CI's matrix runs),
        ``physical_devices``, ``cluster`` and ``auto`` (the kind
        ``mk.strategy()`` would make and why).

    Example:
    ```python
    from mirrorkit.commands import info

    facts = info.collect()
    print(facts["tested_range"]["inside"], facts["auto"]["kind"])
    ```
    """
    import keras
    import tensorflow as tf

    import mirrorkit
    from mirrorkit.strategies import topology

    facts: dict[str, Any] = {
        "versions": {
            "python": platform.python_version(),
            "tensorflow": tf.__version__,
            "keras": keras.__version__,
            "keras_backend": keras.backend.backend(),
            "mirrorkit": mirrorkit.__version__,
        },
        "tested_range": _tested_range(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "physical_devices": [
            d.name.replace("/physical_device:", "") for d in tf.config.list_physical_devices()
        ],
    }
    try:
        info = cluster_info.from_environment()
        facts["cluster"] = {
            "source": info.source,
            "num_workers": info.num_workers,
            "task_type": info.task_type,
            "task_index": info.task_index,
            "worker_index": info.worker_index,
            "is_chief": info.is_chief,
        }
    except ValueError as err:
        facts["cluster"] = {"error": str(err)}
    try:
        choice = topology.plan_auto()
        facts["auto"] = {
            "kind": choice.kind,
            "strategy": _STRATEGY_CLASS[choice.kind],
            "reason": choice.reason,
        }
    except ValueError as err:
        facts["auto"] = {"kind": None, "strategy": None, "reason": str(err)}
    return facts


def _tested_range() -> dict[str, Any]:
    found = versions.installed()
    return {
        "inside": found.in_tested_range,
        "next": found.is_next,
        "range": versions.tested_range(),
        "tensorflow": [".".join(map(str, v)) for v in versions.TESTED_TENSORFLOW],
        "keras": [".".join(map(str, v)) for v in versions.TESTED_KERAS],
        "describe": found.describe(),
    }


_STRATEGY_CLASS = {
    "multi_worker": "MultiWorkerMirroredStrategy",
    "mirrored": "MirroredStrategy",
    "one_device": "OneDeviceStrategy",
}


def format_text(facts: dict[str, Any]) -> str:
    """Renders `collect()`'s dict as aligned text."""
    versions = facts["versions"]
    rows = [
        ("mirrorkit", versions["mirrorkit"]),
        ("tensorflow", versions["tensorflow"]),
        ("keras", f"{versions['keras']} (backend {versions['keras_backend']})"),
        ("tested range", facts["tested_range"]["describe"]),
        ("python", versions["python"]),
        ("platform", facts["platform"]),
        ("CPU cores", str(facts["cpu_count"])),
        ("physical devices", ", ".join(facts["physical_devices"])),
    ]
    found = facts["cluster"]
    if "error" in found:
        rows.append(("cluster", f"ERROR: {found['error']}"))
    elif found["source"] == "none":
        rows.append(("cluster", "none (no TF_CONFIG, no multi-task Slurm step)"))
    else:
        role = f"{found['task_type']} {found['task_index']}"
        if found["worker_index"] is None:
            role += ", not a training worker"
        elif (found["task_type"], found["task_index"]) != ("worker", found["worker_index"]):
            role += f", worker rank {found['worker_index']}"  # a chief task ranks first
        role += " (chief)" if found["is_chief"] else ""
        rows.append(
            ("cluster", f"{found['source']}: {found['num_workers']} workers, this is {role}")
        )
    auto = facts["auto"]
    rows.append(("mk.strategy()", f"{auto['strategy']}, because {auto['reason']}"))
    return tables.pairs(rows)
