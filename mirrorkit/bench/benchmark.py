"""`mk.benchmark`: your model on 1 and N replicas (and workers), side by side, from Python.

The same measurement as ``mirrorkit bench --model module:function``: each configuration
trains in fresh processes (a replica count in one process, a worker count as a local job),
alternated over ``rounds``, and the table gives each one's examples/s, its scaling
efficiency against one replica and its throughput verdict.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from typing import Any


def benchmark(
    make_model: Callable[[], Any],
    data: Callable[[], Any] | None = None,
    *,
    replicas: Sequence[int] = (1, 2),
    workers: Sequence[int] = (1,),
    per_replica_batch_size: int | None = None,
    steps: int = 50,
    repeats: int = 3,
    rounds: int = 1,
    out: str | None = None,
    verbose: bool = True,
) -> dict[str, Any]:
    """Times `make_model` on each replica and worker count, side by side; prints the table.

    Args:
        make_model: returns a compiled Keras model (built under each configuration's
            strategy); a function of a notebook works too, it travels by value.
        data: returns a ``tf.data.Dataset`` of single ``(x, y)`` examples; None makes
            random inputs of the model's input shapes with zero labels.
        replicas: replica counts, each in one fresh process (GPUs, or CPU replicas).
        workers: local worker counts, one replica each (2 or more run a local job).
        per_replica_batch_size: examples a replica takes a step (default 32).
        steps: timed steps an epoch.
        repeats: timed epochs a configuration (after one warm-up epoch).
        rounds: run every configuration this many times, alternating.
        out: a folder for ``bench-<function>.json`` and its PNG; None writes none.
        verbose: print the progress, the table and the verdicts.

    Returns:
        The results, as ``mirrorkit bench`` writes them: ``results`` holds one row per
        configuration (``examples_per_sec``, ``scaling_efficiency``, ``verdict``, ...).

    Raises:
        TypeError: `make_model` returns no compiled model, or `data` no dataset.
        ValueError: bad counts, or examples that do not fit the model.

    Example:
    ```python
    import keras
    import mirrorkit as mk

    def make_model():
        layers = [keras.Input((16,)), keras.layers.Dense(32), keras.layers.Dense(1)]
        model = keras.Sequential(layers)
        model.compile(optimizer="adam", loss="mse")
        return model

    results = mk.benchmark(make_model, replicas=(1, 2), steps=10, repeats=1, verbose=False)
    print([round(row["scaling_efficiency"], 2) for row in results["results"]])
    ```
    """
    from mirrorkit.bench import results as formatted
    from mirrorkit.bench import sweep, user_model

    counts = [*replicas, *workers]
    if not counts or min(counts) < 1 or min(steps, repeats, rounds) < 1:
        raise ValueError(
            f"replicas and workers must be positive counts, and steps, repeats and rounds at "
            f"least 1; got replicas={replicas}, workers={workers}, steps={steps}, "
            f"repeats={repeats}, rounds={rounds}"
        )
    user_model.check(make_model, data)
    batch = per_replica_batch_size or user_model.DEFAULT_BATCH
    name = getattr(make_model, "__name__", "model")
    rows = sweep.scaling(
        make_model, list(replicas), list(workers), batch, steps, repeats, rounds=rounds,
        data=data, progress=sweep.stderr_progress if verbose else (lambda line: None),
    )  # fmt: skip
    results = {
        "model": name,
        "per_replica_batch_size": batch,
        "steps": steps,
        "repeats": repeats,
        "rounds": rounds,
        "results": rows,
    }
    if verbose:
        print(formatted.format_table(rows))
        print(formatted.format_verdicts(rows))
    if out is not None:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"bench-{name}.json"), "w") as f:
            json.dump(results, f, indent=2)
        formatted.plot(results, os.path.join(out, f"bench-{name}.png"))
    return results
