"""`mk.check_equivalence`: does a user's own model train the same on N replicas as on one?

The project's own correctness tests compare weights trained on 1 and N
replicas from the same initial weights and the same global batches. This is
that test for the user's model: each replica count trains in a fresh process
(TensorFlow fixes its devices at first use) on CPU replicas, and the report
gives the largest difference per layer and the causes it recognises.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from typing import Any

from mirrorkit.environment_variables import CUDA_VISIBLE_DEVICES, TF_CONFIG, TF_CPP_MIN_LOG_LEVEL
from mirrorkit.equivalence.report import EquivalenceReport
from mirrorkit.number_checks import positive_int, positive_number

#: Environment of the training processes: CPU replicas only, quiet.
_CHILD_ENV = {CUDA_VISIBLE_DEVICES: "", TF_CPP_MIN_LOG_LEVEL: "2"}


def check_equivalence(
    model_fn: Callable[[], Any],
    data: tuple[Any, Any],
    replicas: Sequence[int] = (1, 2),
    steps: int = 10,
    tolerance: float = 1e-5,
    *,
    batch_size: int = 32,
    timeout_s: float = 600,
) -> EquivalenceReport:
    """Trains `model_fn`'s model on each replica count and compares the weights.

    The first count in `replicas` is the reference. It trains in a fresh
    process from the weights ``model_fn`` gives, twice (a model that differs
    from itself has random or non-deterministic ops); each other count trains
    in its own fresh process from the same initial weights on the same
    `steps` global batches of `batch_size` examples, on that many CPU
    replicas. When a layer differs by more than `tolerance`, the report names
    the causes it recognises: random layers (dropout, noise), batch
    normalisation without synchronisation, a custom ``train_step`` (whose
    losses must be means over the batch, as one device's), and
    non-deterministic ops. The values ``fit`` logs last (loss, metrics) are
    compared too.

    Args:
        model_fn: a function of no arguments returning a compiled `keras.Model`
            (it is sent to the training processes, so define it in the script
            or notebook, not inside another function's closure over TensorFlow
            objects).
        data: ``(x, y)`` NumPy arrays; batches are taken in order, repeating.
        replicas: replica counts, the reference first; each must divide
            `batch_size`.
        steps: optimizer steps to train on each count.
        tolerance: the largest absolute weight difference accepted.
        batch_size: the global batch size, the same on every count.
        timeout_s: stop a training process that takes longer than this.

    Returns:
        An `EquivalenceReport`; ``report.passed`` says whether it matched.

    Raises:
        ValueError: bad replica counts, steps, tolerance, batch size or data.
        mirrorkit.launcher.processes.WorkerError: the model failed to build or
            train; it carries the training process's traceback.

    Example:
    ```python
    import keras
    import numpy as np
    import mirrorkit as mk

    def make_model():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        return model

    x, y = np.random.rand(256, 8).astype("float32"), np.random.rand(256, 1).astype("float32")
    report = mk.check_equivalence(make_model, (x, y), replicas=(1, 2), steps=5)
    print(report)  # largest difference per layer, and why when it differs
    ```
    """
    replicas = _check_arguments(model_fn, data, replicas, steps, tolerance, batch_size)
    x, y = data
    reference, *others = replicas
    first = _train(model_fn, x, y, reference, steps, batch_size, None, timeout_s)
    runs = {
        n: _train(model_fn, x, y, n, steps, batch_size, first["initial"], timeout_s) for n in others
    }
    differences = {n: _per_layer(runs[n]["weights"], first["weights"]) for n in others}
    rerun = max(_per_layer(first["rerun"], first["weights"]).values(), default=0.0)
    logs = {n: _logs_differing(runs[n]["logs"], first["logs"], tolerance) for n in others}
    logs = {n: differing for n, differing in logs.items() if differing}
    weights_agree = rerun <= tolerance and all(
        max(layers.values(), default=0.0) <= tolerance for layers in differences.values()
    )
    passed = weights_agree and not logs
    causes = [] if weights_agree else _causes(first["suspects"], rerun, tolerance, reference)
    if logs and weights_agree:
        causes.append(
            "the weights agree but logged values differ: a custom train_step or metric logs "
            "values that are not one device's (e.g. a loss scaled by the replica count by hand, "
            "or a metric that keeps per-replica state outside Keras's metric variables)"
        )
    return EquivalenceReport(
        passed=passed,
        reference=reference,
        replicas=tuple(replicas),
        steps=steps,
        global_batch_size=batch_size,
        tolerance=tolerance,
        differences=differences,
        rerun_difference=rerun,
        causes=causes,
        log_differences=logs,
    )


def _check_arguments(model_fn, data, replicas, steps, tolerance, batch_size) -> list[int]:
    if not callable(model_fn) or hasattr(model_fn, "fit"):
        raise ValueError(
            "check_equivalence takes a function that builds and compiles the model (it runs in "
            f"fresh processes); got {type(model_fn).__name__}. Pass make_model, not make_model()."
        )
    if not isinstance(data, tuple) or len(data) != 2:
        raise ValueError(f"data must be an (x, y) tuple of arrays; got {type(data).__name__}")
    lengths = {len(data[0]), len(data[1])}
    if len(lengths) != 1:
        raise ValueError(f"x and y must have the same number of examples; got {sorted(lengths)}")
    positive_int(steps, "steps")
    positive_int(batch_size, "batch_size")
    positive_number(tolerance, "tolerance")
    counts = list(replicas) if isinstance(replicas, (list, tuple)) else None
    if (
        not counts
        or len(counts) < 2
        or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in counts)
        or len(set(counts)) != len(counts)
    ):
        raise ValueError(
            "replicas must be at least two different positive replica counts, the reference "
            f"first, e.g. (1, 2); got {replicas!r}"
        )
    uneven = [n for n in counts if batch_size % n]
    if uneven:
        raise ValueError(
            f"batch_size={batch_size} does not split evenly over {uneven} replicas; pick a "
            "global batch size that every replica count divides"
        )
    if lengths.pop() < batch_size:
        raise ValueError(f"data has fewer examples than one global batch of {batch_size}")
    return counts


def _train(model_fn, x, y, replicas, steps, batch_size, initial, timeout_s) -> dict:
    import cloudpickle

    from mirrorkit.launcher.processes import run_function

    # Sent as bytes and loaded after the strategy fixes the devices: importing
    # the module that defines model_fn may initialise TensorFlow.
    return run_function(
        _train_here,
        (cloudpickle.dumps(model_fn), x, y, replicas, steps, batch_size, initial),
        env=lambda i: _CHILD_ENV,
        timeout_s=timeout_s,
        stream=io.StringIO(),
        prefix=f"{replicas}r",
    )[0]


def _train_here(pickled_model_fn, x, y, replicas, steps, batch_size, initial) -> dict:
    """In a fresh process: train on `replicas` CPU replicas; return weights by path."""
    import os

    os.environ.pop(TF_CONFIG, None)  # one process, even when called from a worker
    import cloudpickle
    import numpy as np
    import tensorflow as tf

    import mirrorkit as mk
    from mirrorkit.equivalence import suspects

    if replicas == 1:
        strategy = mk.strategy("one_device", devices=["CPU:0"])
    else:
        strategy = mk.strategy("mirrored", cpu_replicas=replicas)
    model_fn = cloudpickle.loads(pickled_model_fn)

    def run(initial):
        model = mk.build(model_fn, strategy)
        if not model.built:  # a subclassed model fit would build: built here, so that every
            with strategy.scope():  # run starts from the same weights
                model.build(tf.nest.map_structure(lambda a: (None, *a.shape[1:]), x))
        if initial is None:
            initial = model.get_weights()
        model.set_weights(initial)
        data = tf.data.Dataset.from_tensor_slices((x, y)).repeat()
        data = data.batch(batch_size, drop_remainder=True).take(steps)
        history = model.fit(data, epochs=1, verbose=0)
        logs = {name: float(values[-1]) for name, values in history.history.items()}
        weights = [
            (v.path, np.array(w))
            for v, w in zip(model.weights, model.get_weights(), strict=True)
            if "seed_generator" not in v.path
        ]
        return model, initial, weights, logs

    reference = initial is None
    model, initial, weights, logs = run(initial)
    result = {
        "initial": initial,
        "weights": weights,
        "logs": logs,
        "suspects": suspects.find(model),
    }
    if reference:  # the same run again: does the model differ from itself?
        result["rerun"] = run(initial)[2]
    return result


def _per_layer(got: list, want: list) -> dict[str, float]:
    """Largest difference per layer; weights match by position, named by `want`'s paths."""
    import numpy as np

    if [a.shape for _, a in got] != [a.shape for _, a in want]:
        raise ValueError(
            "model_fn built models with different weights in different processes; it must "
            "build the same architecture every time"
        )
    layers: dict[str, float] = {}
    for (_, value), (path, expected) in zip(got, want, strict=True):
        layer = path.rsplit("/", 1)[0]
        diff = float(np.max(np.abs(value - expected))) if expected.size else 0.0
        layers[layer] = max(layers.get(layer, 0.0), diff)
    return layers


def _logs_differing(got: dict, want: dict, tolerance: float) -> dict[str, float]:
    """The logged values (loss, metrics) that differ by more than `tolerance`, relatively."""
    differing = {}
    for name, expected in want.items():
        value = got.get(name)
        if value is None:
            continue
        diff = abs(value - expected) / max(1.0, abs(expected))
        if diff > tolerance:
            differing[name] = diff
    return differing


def _causes(found: dict, rerun: float, tolerance: float, reference: int) -> list[str]:
    from mirrorkit.equivalence import suspects

    causes = suspects.describe(found)
    if rerun > tolerance:
        causes.append(
            f"non-deterministic or unseeded random ops: training {reference} replica(s) twice "
            f"from the same weights and batches differs by {rerun:.3g}; seed them "
            "(keras.utils.set_random_seed) and call tf.config.experimental.enable_op_determinism()"
        )
    if not causes:
        causes.append(
            "none recognised: look for ops that depend on the batch size (per-batch statistics, "
            "losses divided by a local batch size) or on the replica"
        )
    return causes
