"""The strategy factory: `strategy()` picks the devices and makes the strategy; `build()`.

The strings users pass are mapped to strategies in this one place; every error
names the accepted values or what exists on this machine.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Sequence

import keras
import tensorflow as tf

from mirrorkit import allreduce, chief, cluster, topology

KINDS = ("auto", "mirrored", "multi_worker", "one_device", "default")
_ALIASES = {"multi_worker_mirrored": "multi_worker", "off": "default"}

_made: dict[tuple, tf.distribute.Strategy] = {}
_last: list[tf.distribute.Strategy] = []


def strategy(
    kind: str = "auto",
    *,
    devices: Sequence[str] | None = None,
    num_gpus: int | None = None,
    cpu_replicas: int | None = None,
    all_reduce: str = "auto",
    bucket_mb: float | None = None,
    timeout_s: float | None = None,
) -> tf.distribute.Strategy:
    """Makes the `tf.distribute.Strategy` for this machine or cluster.

    ``kind="auto"`` chooses, first match wins:

    1. ``TF_CONFIG`` naming more than one training task, or a Slurm step with
       more than one task: `tf.distribute.MultiWorkerMirroredStrategy`.
    2. Two or more GPUs: `tf.distribute.MirroredStrategy` over them.
    3. ``cpu_replicas=N`` (N >= 2): `MirroredStrategy` over N logical CPU
       devices, real replicas on a laptop, in a notebook or in tests.
    4. Otherwise `tf.distribute.OneDeviceStrategy` (GPU:0, else CPU:0).

    Calling it again with the same request returns the same strategy, so a
    notebook cell can run twice. It prints one line on the chief when it makes
    a strategy.

    Args:
        kind: ``auto``, ``mirrored``, ``multi_worker`` (alias
            ``multi_worker_mirrored``), ``one_device`` or ``default`` (alias
            ``off``: TensorFlow's default, no distribution); case-insensitive.
        devices: explicit replica devices for ``mirrored`` or ``one_device``,
            e.g. ``["GPU:0", "GPU:2"]``.
        num_gpus: use the first N GPUs.
        cpu_replicas: split the CPU into N logical devices, one replica each.
            Must come before anything else initialises TensorFlow's devices;
            after that, N up to the number of logical CPUs already fixed is
            served from those (said once), and a larger N is an error.
        all_reduce: ``auto``, ``nccl``, ``ring``, ``hierarchical_copy`` or
            ``reduce_to_one``; see `mirrorkit.allreduce`.
        bucket_mb: pack gradients into all-reduce buckets of this many MB.
        timeout_s: abort a collective that waits longer than this (the
            collective all-reduce only; a warning where TensorFlow has none).

    Returns:
        A `tf.distribute.Strategy`: TensorFlow's own object, no wrapper.

    Raises:
        ValueError: an unknown kind or all-reduce, contradictory arguments,
            more GPUs than exist, a device that does not exist, a malformed
            TF_CONFIG, or a GPU-only all-reduce without GPUs.
        RuntimeError: a request that conflicts with devices TensorFlow has
            already fixed in this process.

    Example:
    ```python
    import keras
    import mirrorkit as mk

    strategy = mk.strategy(cpu_replicas=2)  # MirroredStrategy, 2 replicas
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    ```
    """
    name = normalize_kind(kind)
    _check_backend()
    _check_arguments(name, devices, num_gpus, cpu_replicas, bucket_mb, timeout_s)
    all_reduce = allreduce.normalize(all_reduce)
    devices = tuple(topology.short_device(d) for d in devices) if devices else None
    resolved = _resolve_auto(devices, num_gpus, cpu_replicas) if name == "auto" else name
    if name == "auto" and resolved in ("one_device", "default"):
        _warn_unused_all_reduce(all_reduce, bucket_mb, timeout_s)
        all_reduce, bucket_mb, timeout_s = "auto", None, None
    elif resolved in ("one_device", "default"):
        _refuse_all_reduce_options(resolved, all_reduce, bucket_mb, timeout_s)

    key = (
        resolved,
        devices,
        num_gpus,
        cpu_replicas,
        all_reduce,
        bucket_mb,
        timeout_s,
        os.environ.get("TF_CONFIG", ""),
    )
    if key in _made:
        _set_current(_made[key])
        return _made[key]
    if cpu_replicas is not None:
        _ensure_cpu_replicas(cpu_replicas)
    made = _BUILDERS[resolved](
        devices=devices,
        num_gpus=num_gpus,
        cpu_replicas=cpu_replicas,
        all_reduce=all_reduce,
        bucket_mb=bucket_mb,
        timeout_s=timeout_s,
    )
    _made[key] = made
    _set_current(made)
    from mirrorkit import compat

    compat.apply_for(made)
    chief.say(topology.describe(made).summary())
    return made


def build(
    model_fn: Callable[[], keras.Model],
    strategy: tf.distribute.Strategy | None = None,
    *,
    gradient_compression: str | None = None,
    step_logs: str = "averaged",
) -> keras.Model:
    """Calls ``model_fn()`` under the strategy's scope and returns its model.

    Construct and compile the model inside ``model_fn`` so that its weights,
    optimizer state and metrics are created mirrored on every replica.

    Args:
        model_fn: a function of no arguments returning a (compiled) `keras.Model`.
        strategy: the strategy; None means the strategy in scope, else the one
            `strategy()` made last, else TensorFlow's default.
        gradient_compression: ``"fp16"`` or ``"bf16"`` all-reduces float32
            gradients in 16 bits (half the bytes, less precision; see
            `mirrorkit.compression`); None (the default) keeps float32.
        step_logs: ``"averaged"`` (the default) averages the logs Keras
            hands to the progress bar and ``on_train_batch_end`` over every
            replica after each step; ``"local"`` averages them over this
            worker's replicas only, sparing a cross-worker collective per
            step (multi-worker only; epoch logs and ``History`` stay averaged
            over every replica). It belongs to the strategy: the last `build`
            on a strategy sets it.

    Returns:
        The `keras.Model` that ``model_fn`` returned.

    Example:
    ```python
    import keras
    import mirrorkit as mk

    def make_model():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
        return model

    model = mk.build(make_model, mk.strategy(cpu_replicas=2))
    ```
    """
    if step_logs not in STEP_LOGS:
        raise ValueError(f"step_logs must be 'averaged' or 'local'; got {step_logs!r}")
    if isinstance(model_fn, keras.Model) or not callable(model_fn):
        raise TypeError(
            f"build() takes a function that returns a keras.Model; got {type(model_fn).__name__}. "
            "Pass the function itself (mk.build(make_model)), not its result."
        )
    chosen = strategy or current_strategy()
    with chosen.scope():
        model = model_fn()
        if not isinstance(model, keras.Model):
            raise TypeError(
                f"model_fn must return a keras.Model; it returned {type(model).__name__}"
            )
        from mirrorkit import compat

        compat.prepare_model(model, chosen)
    _set_step_logs(chosen, step_logs)
    if gradient_compression is not None:
        from mirrorkit import compression

        compression.apply(model, gradient_compression, chosen)
    return model


#: What `build`'s ``step_logs`` accepts.
STEP_LOGS = ("averaged", "local")


def _set_step_logs(chosen: tf.distribute.Strategy, step_logs: str) -> None:
    from mirrorkit.compat.multi_worker_reduce import LOCAL_STEP_LOGS

    local = step_logs == "local" and isinstance(chosen, tf.distribute.MultiWorkerMirroredStrategy)
    setattr(chosen, LOCAL_STEP_LOGS, local)
    if local:
        chief.say_once(
            "step-logs-local",
            "per-step logs (progress bar, on_train_batch_end) are this worker's own "
            "(step_logs='local'): no cross-worker collective per step; epoch logs and History "
            "are averaged over every replica",
        )


def current_strategy() -> tf.distribute.Strategy:
    """The strategy in scope, else the one `strategy()` made last, else the default."""
    if tf.distribute.has_strategy():
        return tf.distribute.get_strategy()
    if _last:
        return _last[0]
    return tf.distribute.get_strategy()


def normalize_kind(kind: str) -> str:
    """Returns the canonical kind name, or raises naming the valid ones."""
    name = kind.lower() if isinstance(kind, str) else kind
    name = _ALIASES.get(name, name)
    if name not in KINDS:
        valid = ", ".join(KINDS + tuple(f"{a} (= {b})" for a, b in _ALIASES.items()))
        raise ValueError(f"Unknown strategy kind {kind!r}; valid kinds are {valid}")
    return name


def _check_backend() -> None:
    backend = keras.backend.backend()
    if backend != "tensorflow":
        raise RuntimeError(
            f"Keras runs on the {backend!r} backend here; mirrorkit needs 'tensorflow'. Set "
            "KERAS_BACKEND=tensorflow before Python starts (or before keras is first imported)."
        )


def _set_current(made: tf.distribute.Strategy) -> None:
    _last[:] = [made]


def _check_arguments(name, devices, num_gpus, cpu_replicas, bucket_mb, timeout_s) -> None:
    for label, value in (("num_gpus", num_gpus), ("cpu_replicas", cpu_replicas)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{label} must be an integer; got {value!r}")
    if num_gpus is not None and num_gpus < 0:
        raise ValueError(f"num_gpus must be >= 0; got {num_gpus}")
    if cpu_replicas is not None and cpu_replicas < 1:
        raise ValueError(f"cpu_replicas must be >= 1; got {cpu_replicas}")
    for label, value in (("bucket_mb", bucket_mb), ("timeout_s", timeout_s)):
        if value is not None and (isinstance(value, bool) or not value > 0):
            raise ValueError(f"{label} must be a positive number of seconds or MB; got {value!r}")
    if devices is not None and (isinstance(devices, str) or not devices):
        raise ValueError(
            f"devices must be a non-empty list of device names such as ['GPU:0', 'GPU:1']; "
            f"got {devices!r}"
        )
    given = [
        label
        for label, value in (
            ("devices", devices),
            ("num_gpus", num_gpus),
            ("cpu_replicas", cpu_replicas),
        )
        if value is not None
    ]
    if len(given) > 1:
        raise ValueError(
            f"{' and '.join(given)} both choose the replica devices; pass only one of them"
        )
    if name == "default" and given:
        raise ValueError(f"kind='default' runs without distribution; it takes no {given[0]}")
    if name == "multi_worker" and (devices is not None or cpu_replicas is not None):
        raise ValueError(
            "kind='multi_worker' uses every GPU of each worker (or its CPU); it takes no "
            f"{given[0]}. Use num_gpus to limit the GPUs per worker."
        )
    if name == "one_device":
        if devices is not None and len(devices) != 1:
            raise ValueError(f"kind='one_device' takes exactly one device; got {list(devices)}")
        if (num_gpus or 0) > 1 or (cpu_replicas or 0) > 1:
            raise ValueError(
                "kind='one_device' runs one replica; num_gpus or cpu_replicas above 1 "
                "contradicts it. Use kind='mirrored' for several replicas."
            )


def _resolve_auto(devices, num_gpus, cpu_replicas) -> str:
    if devices is not None:
        return "mirrored" if len(devices) > 1 else "one_device"
    return topology.plan_auto(cpu_replicas=cpu_replicas, num_gpus=num_gpus).kind


def _warn_unused_all_reduce(all_reduce, bucket_mb, timeout_s) -> None:
    unused = [
        f"{label}={value!r}"
        for label, value in (
            ("all_reduce", all_reduce),
            ("bucket_mb", bucket_mb),
            ("timeout_s", timeout_s),
        )
        if value not in (None, "auto")
    ]
    if unused:
        chief.warn_once(
            "unused-all-reduce",
            f"kind='auto' chose one device here, so {', '.join(unused)} has nothing to all-reduce "
            "and is ignored.",
        )


def _refuse_all_reduce_options(kind, all_reduce, bucket_mb, timeout_s) -> None:
    if all_reduce != "auto" or bucket_mb is not None or timeout_s is not None:
        raise ValueError(
            f"kind={kind!r} runs one replica with nothing to all-reduce; all_reduce, bucket_mb "
            "and timeout_s apply to 'mirrored' and 'multi_worker'"
        )


def _ensure_cpu_replicas(n: int) -> None:
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


def _logical(device_type: str) -> list[str]:
    return [topology.short_device(d.name) for d in tf.config.list_logical_devices(device_type)]


def _gpus_for(num_gpus: int | None) -> list[str]:
    gpus = _logical("GPU")
    if num_gpus is None:
        return gpus
    if num_gpus > len(gpus):
        have = ", ".join(gpus) if gpus else "none"
        raise ValueError(
            f"num_gpus={num_gpus} was asked for, but this process sees {len(gpus)} GPU(s) "
            f"({have}). Check CUDA_VISIBLE_DEVICES and `mirrorkit info`."
        )
    return gpus[:num_gpus]


def _check_devices_exist(devices: tuple[str, ...]) -> None:
    existing = _logical("CPU") + _logical("GPU")
    missing = [d for d in devices if d not in existing]
    if missing:
        raise ValueError(
            f"device(s) {', '.join(missing)} do not exist in this process; it has "
            f"{', '.join(existing)}"
        )


def _mirrored(*, devices, num_gpus, cpu_replicas, all_reduce, bucket_mb, timeout_s):
    if devices is None:
        if cpu_replicas is not None:
            devices = tuple(_logical("CPU")[:cpu_replicas])
        else:
            devices = tuple(_gpus_for(num_gpus)) or ("CPU:0",)
    else:
        _check_devices_exist(devices)
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
        extended = made.extended
        extended._communication_options = extended._communication_options.merge(plan.options)
    return made


#: Collective group keys reserved for each MirroredStrategy mirrorkit makes.
_KEYS_PER_STRATEGY = 100_000
_strategies_made = itertools.count()


def _with_own_collective_keys(make):
    """Makes a MirroredStrategy whose collective group keys no earlier one uses.

    Every MirroredStrategy numbers its collective groups from 1, so a second
    strategy with a different replica count in the same process (a notebook
    going from 4 replicas to 2) joins group 1 with the wrong size and fails
    ("is joining a group with size 2, but that group has size 4"). The class
    attribute ``_collective_key_base`` (TF 2.17-2.21) offsets the keys; it is
    set for the construction only; plain MirroredStrategy objects keep base 0.
    """
    cls = tf.distribute.MirroredStrategy
    saved = cls.__dict__.get("_collective_key_base", None)
    cls._collective_key_base = (next(_strategies_made) + 1) * _KEYS_PER_STRATEGY
    try:
        return make()
    finally:
        if saved is None:
            del cls._collective_key_base
        else:
            cls._collective_key_base = saved


def _multi_worker(*, devices, num_gpus, cpu_replicas, all_reduce, bucket_mb, timeout_s):
    info = cluster.from_environment()  # validates TF_CONFIG, naming a bad field
    if num_gpus is not None:
        physical = tf.config.list_physical_devices("GPU")
        if num_gpus > len(physical):
            raise ValueError(
                f"num_gpus={num_gpus} was asked for, but this worker has {len(physical)} GPU(s)"
            )
        tf.config.set_visible_devices(physical[:num_gpus], "GPU")
    has_gpus = bool(tf.config.list_physical_devices("GPU")) and num_gpus != 0
    options = allreduce.plan_multi_worker(
        all_reduce, has_gpus=has_gpus, bucket_mb=bucket_mb, timeout_s=timeout_s
    )
    resolver = None
    if info.source == "slurm":
        resolver = tf.distribute.cluster_resolver.SlurmClusterResolver()
    elif info.source == "none":
        chief.say_once(
            "single-worker-mwms",
            "kind='multi_worker' without TF_CONFIG or Slurm: a multi-worker strategy of one worker",
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


def _one_device(*, devices, num_gpus, cpu_replicas, all_reduce, bucket_mb, timeout_s):
    if devices:
        _check_devices_exist(devices)
        device = devices[0]
    elif num_gpus == 0 or cpu_replicas is not None:
        device = "CPU:0"
    else:
        gpus = _gpus_for(num_gpus)
        device = gpus[0] if gpus else "CPU:0"
    return tf.distribute.OneDeviceStrategy(f"/{device}")


def _default(**_unused):
    from tensorflow.python.distribute import distribute_lib

    return distribute_lib._get_default_strategy()


_BUILDERS = {
    "mirrored": _mirrored,
    "multi_worker": _multi_worker,
    "one_device": _one_device,
    "default": _default,
}
