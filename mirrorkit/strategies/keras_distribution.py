"""Repairs: Keras 3's ``keras.distribution.DataParallel`` trains data-parallel on TensorFlow.

Upstream: Keras's TensorFlow backend has no distribution (its ``distribution_lib`` opens
"DO NOT USE"): ``keras.distribution.set_distribution(DataParallel(...))``, keras.io's way to
train data-parallel on any backend, trains on one device on TensorFlow, with no word
(docs: keras-distribution/). mirrorkit's post-import hook (`mirrorkit.patching.post_import`)
puts these repairs in place when Keras is imported, before or after mirrorkit:

- ``keras_distribution_data_parallel`` (``set_distribution``, and the name
  ``keras.distribution`` gives it): a ``DataParallel`` makes `mk.strategy` for its devices
  (``MirroredStrategy`` over them on one host; across the workers that ``mirrorkit
  launch`` or an engine started, ``MultiWorkerMirroredStrategy``) and sets it as
  TensorFlow's own global strategy, so that the model built after it is built in its scope
  and ``fit``, ``evaluate`` and ``predict`` run on every replica, with every repair
  `mk.strategy` brings. ``set_distribution(None)`` (the end of ``distribution.scope()``)
  takes it off again. Any other distribution (``ModelParallel``) is refused: TensorFlow's
  strategies replicate every weight.
- ``keras_distribution_devices`` (the TensorFlow backend's ``list_devices``): across workers,
  every worker's devices, numbered as JAX numbers them (``cpu:0`` ... ``cpu:N-1``), so that
  ``DataParallel(devices=keras.distribution.list_devices())`` spans the job.
"""

from __future__ import annotations

import sys
from typing import Any

import tensorflow as tf

from mirrorkit.cluster import chief, cluster_info, workers
from mirrorkit.cluster.workers import every_strategy
from mirrorkit.compat._multi_worker import OWN_CANARY
from mirrorkit.patching.repair import Repair

_LIB = "keras.src.distribution.distribution_lib"
_BACKEND_LIB = "keras.src.backend.tensorflow.distribution_lib"
#: The canary that takes one repair of set_distribution off alone.
_ALONE = (
    "tests/test_keras_distribution.py::"
    "test_a_data_parallel_repair_taken_off_alone_trains_on_one_replica_upstream"
)
_TESTS = (
    "tests/test_keras_distribution.py::test_the_guides_data_parallel_on_two_replicas_equals_one_device",
    "tests/test_keras_distribution.py::test_the_guides_data_parallel_on_two_workers_equals_one_device",
    # its canary: plain Keras trains the DataParallel on one replica
    "tests/test_keras_distribution.py::test_data_parallel_trains_on_one_replica_upstream",
)

#: The strategies made for DataParallels, by their devices: a scope entered again reuses it.
_MADE: dict[tuple[str, ...], tf.distribute.Strategy] = {}
_SET: list[Any] = [None]  # the strategy this module set as TensorFlow's global one


def _on_tensorflow() -> bool:
    from keras import backend

    return backend.backend() == "tensorflow"


def _refused(value: Any) -> str | None:
    """Why mirrorkit cannot train `value` on TensorFlow, or None where it can."""
    lib = sys.modules[_LIB]
    if not isinstance(value, lib.DataParallel):
        return (
            f"keras.distribution.{type(value).__name__} shards weights, which TensorFlow's "
            "strategies do not: every replica holds every weight. On the TensorFlow backend "
            "mirrorkit trains keras.distribution.DataParallel (data parallelism on every "
            "device); use it, or another Keras backend for model parallelism"
        )
    return None


def _strategy_for(value: Any) -> tf.distribute.Strategy:
    """`mk.strategy` for the DataParallel's devices (one made per set of devices)."""
    from mirrorkit.strategies.factory import strategy as make_strategy  # it imports compat

    devices = tuple(str(d) for d in value.device_mesh.devices.ravel())
    if devices in _MADE:
        return _MADE[devices]
    cluster = cluster_info.from_environment()
    if cluster.is_multi_worker:
        made = _multi_worker()
    elif len(devices) > 1:
        made = make_strategy("mirrored", devices=[_tf_device(d) for d in devices])
    else:
        made = make_strategy("one_device", devices=[_tf_device(d) for d in devices])
    if made.num_replicas_in_sync != len(devices):
        raise ValueError(
            f"this DataParallel's mesh holds {len(devices)} devices, but the job has "
            f"{made.num_replicas_in_sync} replicas ({cluster.num_workers} worker(s)): on "
            "TensorFlow every device of every worker trains. Use DataParallel() or "
            "DataParallel(devices=keras.distribution.list_devices())"
        )
    _MADE[devices] = made
    return made


def _multi_worker() -> tf.distribute.Strategy:
    """The job's multi-worker strategy, made once.

    It must be TensorFlow's first work in the process, so ``list_devices`` (the guide's
    first line) makes it.
    """
    from mirrorkit.strategies.factory import strategy as make_strategy  # it imports compat

    if ("multi_worker",) not in _MADE:
        _MADE[("multi_worker",)] = make_strategy("multi_worker")
    return _MADE[("multi_worker",)]


def _tf_device(name: str) -> str:
    """``"cpu:1"`` (Keras's name) -> ``"/CPU:1"`` (TensorFlow's)."""
    kind, _, index = name.rpartition(":")
    return f"/{kind.upper()}:{index}" if kind else name


def _follow(value: Any) -> None:
    """Makes TensorFlow's global strategy follow Keras's global distribution."""
    if value is None:
        if _SET[0] is not None and tf.distribute.get_strategy() is _SET[0]:
            tf.distribute.experimental_set_strategy(None)
        _SET[0] = None
        return
    made = _strategy_for(value)
    if tf.distribute.get_strategy() is not made:
        tf.distribute.experimental_set_strategy(made)
    _SET[0] = made
    chief.say_once(
        "keras-distribution-data-parallel",
        f"keras.distribution.DataParallel of {value.device_mesh.devices.size} device(s) trains "
        f"on {_kind(made)}, {made.num_replicas_in_sync} replica(s) (mirrorkit's "
        "strategy, TensorFlow's global one while it is set): build the model after "
        "set_distribution (or inside distribution.scope()), then compile and fit as usual",
    )


def _kind(made: tf.distribute.Strategy) -> str:
    return "MultiWorkerMirroredStrategy" if workers.is_multi_worker(made) else type(made).__name__


def _set_distribution(original):
    def set_distribution(value):
        if value is not None and _on_tensorflow():
            why = _refused(value)
            if why is not None:
                raise ValueError(f"mirrorkit: {why}.")
        original(value)
        if _on_tensorflow():
            _follow(value)

    set_distribution.__wrapped__ = original
    set_distribution.__doc__ = original.__doc__
    return set_distribution


def _public_name(original):
    def set_distribution(value):
        return sys.modules[_LIB].set_distribution(value)

    set_distribution.__wrapped__ = original
    set_distribution.__doc__ = original.__doc__
    return set_distribution


def _global_devices(original):
    def list_devices(device_type=None):
        if not cluster_info.from_environment().is_multi_worker:
            return original(device_type)
        # Across workers: the job's strategy first (TensorFlow's first work), then every
        # worker's devices of its kind, numbered across the job.
        made = _multi_worker()
        local = original(device_type)
        kind = local[0].rpartition(":")[0] if local else "cpu"
        return [f"{kind}:{i}" for i in range(made.num_replicas_in_sync)]

    list_devices.__wrapped__ = original
    list_devices.__doc__ = original.__doc__
    return list_devices


DATA_PARALLEL = Repair(
    name="keras_distribution_data_parallel",
    upstream="Keras's TensorFlow backend has no distribution: a DataParallel trains on one device",
    module=_LIB,
    target="set_distribution",
    replacement=_set_distribution,
    applies_to=every_strategy,
    account="keras-3-distribution-code",
    tests=(f"{_ALONE}[keras_distribution_data_parallel]", *_TESTS),
    applied_when="when Keras is imported",
)

PUBLIC_NAME = Repair(
    name="keras_distribution_public_name",
    upstream="keras.distribution's own name for set_distribution (bound at import)",
    module="keras.distribution",
    target="set_distribution",
    replacement=_public_name,
    applies_to=every_strategy,
    account="keras-3-distribution-code",
    tests=(f"{_ALONE}[keras_distribution_public_name]", *_TESTS),
    applied_when="when Keras is imported",
)

DEVICES = Repair(
    name="keras_distribution_devices",
    upstream="Keras's TensorFlow list_devices names one worker's devices, the same on each",
    module=_BACKEND_LIB,
    target="list_devices",
    replacement=_global_devices,
    applies_to=every_strategy,
    account="keras-3-distribution-code",
    # its canary: the case of the 2-worker canary that takes it off alone
    tests=(f"{OWN_CANARY}[keras_distribution_devices]", *_TESTS),
    applied_when="when Keras is imported",
)

REPAIRS = (DATA_PARALLEL, PUBLIC_NAME, DEVICES)


def apply() -> None:
    """Puts the repairs in place (mirrorkit's post-import hook calls it once Keras is in)."""
    for repair in REPAIRS:
        repair.apply()
