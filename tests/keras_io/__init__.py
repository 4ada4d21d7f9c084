"""keras.io examples ported to mirrorkit: the conformance corpus.

Each module here is one example from https://keras.io/examples/ (or a keras.io guide), with two
functions that run it start to finish:

- ``original(workdir)``: the example's own code (stand-in data read from
  ``workdir``, smaller sizes, no plots or downloads), run without mirrorkit;
- ``ported(workdir, cpu_replicas)``: the same code converted to mirrorkit the
  way docs/index.md shows (code that builds its model at module level), on
  ``mk.strategy(cpu_replicas=cpu_replicas)``.

The two differ only in the lines a user changes to go data-parallel;
`changed_lines` counts them with difflib and each module states the count in
``LINES_CHANGED``, which the test checks. ``write_data(workdir)`` writes the
stand-in data set. Both functions return `outcome(...)`: the History, final
weights and every optimizer's ``iterations``, to be compared number by number.

`run_all` runs every example of one placement in one fresh process (TensorFlow
starts once), deterministically: `keras.utils.set_random_seed` before each
example and `tf.config.experimental.enable_op_determinism()`.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import traceback

#: The ported examples, by module name.
EXAMPLES = (
    "image_classification_from_scratch",
    "text_classification_from_scratch",
    "structured_data_feature_space",
    "timeseries_weather_forecasting",
    "mnist_convnet",
    "imbalanced_classification",
    "custom_train_step",
    "dcgan",
    "wgan_gp",
    "vae",
    "knowledge_distillation",
    "subclassing_add_loss",
    "transfer_learning",
    "multi_label_classification",
    "sequential_retrieval",
    "dual_encoder",
)

#: The examples that write their own training step or loss (GANs, VAEs, distillation, add_loss,
#: an in-batch retrieval loss) or fine-tune a pretrained base: also run on 2 workers
#: (tests/test_keras_io_examples.py).
OWN_STEPS = (
    "custom_train_step",
    "dcgan",
    "wgan_gp",
    "vae",
    "knowledge_distillation",
    "subclassing_add_loss",
    "transfer_learning",
    "sequential_retrieval",
    "dual_encoder",
)

SEED = 1337


def load(name: str):
    return importlib.import_module(f"keras_io.{name}")


def missing(name: str) -> list[str]:
    """The optional packages example `name` needs (its ``REQUIRES``) that are not installed:
    keras-rs is mirrorkit's ``rs`` extra, installed in CI's newest leg only."""
    import importlib.util

    return [p for p in getattr(load(name), "REQUIRES", ()) if importlib.util.find_spec(p) is None]


def optimizers(model) -> dict:
    """Every optimizer `model` holds, by attribute (``d_optimizer``, ...), with those inside
    a ``LossScaleOptimizer`` or ``MultiOptimizer``."""
    import keras

    found = {}
    for name, value in vars(model).items():
        if isinstance(value, keras.optimizers.Optimizer):
            found[name] = value
            if hasattr(value, "inner_optimizer"):
                found[f"{name}.inner_optimizer"] = value.inner_optimizer
            for i, inner in enumerate(getattr(value, "optimizers", None) or []):
                found[f"{name}.optimizers[{i}]"] = inner
    return found


def outcome(model, history, **extra):
    """The numbers to compare: History, final weights, every optimizer's steps, and `extra`."""
    return {
        "history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
        "weights": [w.copy() for w in model.get_weights()],
        "iterations": {k: int(o.iterations.numpy()) for k, o in optimizers(model).items()},
        **extra,
    }


def run_one(name: str, workdir: str, cpu_replicas: int | None, port: bool):
    """One example: `ported` on `cpu_replicas` (None: ``mk.strategy()``'s choice, e.g. the
    workers of a job) when `port`, else `original`."""
    import keras
    import tensorflow as tf

    keras.backend.clear_session()
    keras.utils.set_random_seed(SEED)
    tf.config.experimental.enable_op_determinism()
    module = load(name)
    if not port:
        return module.original(os.path.join(workdir, name))
    return module.ported(os.path.join(workdir, name), cpu_replicas)


def run_all(workdir: str, cpu_replicas: int | None, names=EXAMPLES, port=None):
    """In a fresh process: every example; name -> outcome, or {"error": traceback}.

    `port` (default: whether `cpu_replicas` is given) runs the ported examples; with
    ``cpu_replicas=None`` they run on ``mk.strategy()``'s choice (a worker's job).
    """
    port = cpu_replicas is not None if port is None else port
    if port:  # first: TensorFlow fixes its devices at first use
        import mirrorkit as mk

        mk.strategy(cpu_replicas=cpu_replicas)
    results = {}
    for name in names:
        if missing(name):
            results[name] = {"missing": missing(name)}
            continue
        try:
            results[name] = run_one(name, workdir, cpu_replicas, port)
        except Exception:  # noqa: BLE001 - each example's failure is reported on its own
            results[name] = {"error": traceback.format_exc()}
    return results


def write_all(workdir: str, names=EXAMPLES) -> None:
    for name in names:
        if missing(name):
            continue
        path = os.path.join(workdir, name)
        os.makedirs(path, exist_ok=True)
        load(name).write_data(path)


def _body(fn) -> list[str]:
    lines = inspect.getsource(fn).splitlines()
    start = next(i for i, line in enumerate(lines) if line.rstrip().endswith(":")) + 1
    return [line for line in lines[start:] if line.strip()]


def changed_lines(module) -> dict[str, int]:
    """difflib of ``ported`` against ``original`` (bodies, blank lines left out).

    ``added``: lines of the port not in the original (new or edited, re-indented
    included); ``removed``: lines of the original not in the port;
    ``reindented``: added lines that differ from a removed one only in indentation.
    """
    diff = list(difflib.ndiff(_body(module.original), _body(module.ported)))
    added = [line[2:] for line in diff if line.startswith("+ ")]
    removed = [line[2:].strip() for line in diff if line.startswith("- ")]
    reindented = sum(1 for line in added if line.strip() in removed)
    return {"added": len(added), "removed": len(removed), "reindented": reindented}
