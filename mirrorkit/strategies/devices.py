"""Device names and this process's replica devices: logical CPUs, visible GPUs.

`short_device` and `compact_devices` turn TensorFlow's device names into the
ones users write (``CPU:1``, ``GPU:0-3``). The other functions look at, or fix,
the logical devices TensorFlow has in this process, with errors that say what
was asked for, what exists and what to do.
"""

from __future__ import annotations

import re

import tensorflow as tf

from mirrorkit.cluster import chief


def short_device(name: str) -> str:
    """``/job:localhost/replica:0/task:0/device:CPU:1`` -> ``CPU:1``."""
    match = re.search(r"(?:device:)?([A-Za-z_]+):(\d+)$", name)
    return f"{match.group(1).upper()}:{match.group(2)}" if match else name


def compact_devices(devices: tuple[str, ...] | list[str]) -> str:
    """``("CPU:0", "CPU:1", "CPU:2")`` -> ``CPU:0-2``; mixed lists stay listed."""
    names = [short_device(d) for d in devices]
    kinds = {n.split(":")[0] for n in names}
    if len(names) > 1 and len(kinds) == 1:
        kind = kinds.pop()
        ids = [int(n.split(":")[1]) for n in names]
        if ids == list(range(ids[0], ids[0] + len(ids))):
            return f"{kind}:{ids[0]}-{ids[-1]}"
    return ", ".join(names)


def logical(device_type: str) -> list[str]:
    """This process's logical devices of one type, short names (``["CPU:0", ...]``)."""
    return [short_device(d.name) for d in tf.config.list_logical_devices(device_type)]


def gpus_for(num_gpus: int | None) -> list[str]:
    """The first `num_gpus` GPUs (all when None), or an error if there are fewer."""
    gpus = logical("GPU")
    if num_gpus is None:
        return gpus
    if num_gpus > len(gpus):
        have = ", ".join(gpus) if gpus else "none"
        raise ValueError(
            f"num_gpus={num_gpus} was asked for, but this process sees {len(gpus)} GPU(s) "
            f"({have}). Check CUDA_VISIBLE_DEVICES and `mirrorkit info`."
        )
    return gpus[:num_gpus]


def check_exist(devices: tuple[str, ...]) -> None:
    """Raises naming the devices (short names) this process does not have."""
    existing = logical("CPU") + logical("GPU")
    missing = [d for d in devices if d not in existing]
    if missing:
        raise ValueError(
            f"device(s) {', '.join(missing)} do not exist in this process; it has "
            f"{', '.join(existing)}"
        )


def ensure_cpu_replicas(n: int) -> None:
    """Splits the CPU into `n` logical devices, or serves `n` from those already fixed.

    TensorFlow fixes its logical devices at first use. Before that, this sets
    `n`; after it, `n` up to the number already fixed is served from them
    (said once), and a larger `n` is an error saying how to get it.
    """
    cpu = tf.config.list_physical_devices("CPU")[0]
    configured = tf.config.get_logical_device_configuration(cpu)
    if configured is not None and len(configured) == n:
        return
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(n)]
        )
        return
    except RuntimeError:
        have = len(tf.config.list_logical_devices("CPU"))
    if have > n:
        chief.say_once(
            f"cpu-subset-{n}",
            f"cpu_replicas={n}: TensorFlow already fixed {have} logical CPU devices in this "
            f"process; using CPU:0-{n - 1} of them",
        )
    elif have < n:
        raise RuntimeError(
            f"cpu_replicas={n} was asked for, but TensorFlow has already initialised its devices "
            f"in this process with {have} logical CPU device(s), and they cannot change after "
            f"that. Call mk.strategy(cpu_replicas={n}) before any other TensorFlow work (first "
            "thing in the script, or the first cell of the notebook), or restart the kernel."
        )
