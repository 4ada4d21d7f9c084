"""Your own model in `mirrorkit bench`: ``module:function`` loaded, built, and fed.

``mirrorkit bench --model my_module:make_model`` (or ``path/to/file.py:make_model``)
times a model of yours instead of a bundled one: ``make_model()`` returns a
compiled Keras model, built under each configuration's strategy. Its inputs are
``--data my_module:make_dataset``'s examples, or, without ``--data``, random
inputs of the model's input shapes with zero labels: of its output shape, or
without the last axis as integers for a sparse loss (``sparse_categorical_crossentropy``).
Before anything is timed, one step on two examples checks that they fit. The
functions travel to the benchmark's fresh processes by value (a file) or by
name (an importable module).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any

#: The per-replica batch of a model of yours, unless ``--batch-size`` says otherwise.
DEFAULT_BATCH = 32


def is_spec(model: Any) -> bool:
    """Whether `model` names a function of yours (``module:function``) or is a callable."""
    return callable(model) or (isinstance(model, str) and ":" in model)


def load(spec: str, what: str = "--model") -> Callable[[], Any]:
    """The function ``module:function`` or ``path/to/file.py:function`` names.

    Args:
        spec: ``module:function`` (importable from the current folder or ``sys.path``) or
            ``file.py:function``.
        what: the flag that gave it, named in errors.

    Returns:
        The function.

    Raises:
        ValueError: `spec` is not ``module:function``, the module or file cannot be
            imported, or it has no such function.

    Example:
    ```python
    from mirrorkit.bench.user_model import load

    make = load("mirrorkit.bench.models:_mlp")
    print(make().name)  # mlp
    ```
    """
    module_name, _, function = spec.rpartition(":")
    if not module_name or not function:
        raise ValueError(
            f"{what} {spec!r}: give a module and a function, as module:function or "
            "path/to/file.py:function (the function returns a compiled Keras model)"
        )
    try:
        module = _import(module_name)
    except Exception as err:  # noqa: BLE001 - any import error is the user's module's
        raise ValueError(
            f"{what} {spec!r}: cannot import {module_name!r} ({type(err).__name__}: {err}); "
            "run from the folder that holds it, or give the file's path"
        ) from err
    found = getattr(module, function, None)
    if not callable(found):
        names = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise ValueError(
            f"{what} {spec!r}: {module_name} has no function {function!r} "
            f"(its functions: {', '.join(names) or 'none'})"
        )
    return found


def _import(name: str):
    if name.endswith(".py") or os.sep in name:
        path = os.path.abspath(name)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no file {path}")
        module_name = "mirrorkit_bench_" + os.path.splitext(os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
        import cloudpickle

        cloudpickle.register_pickle_by_value(module)  # the fresh processes cannot import it
        return module
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return importlib.import_module(name)


def build(make_model: Callable[[], Any], strategy: Any, **build_args: Any) -> Any:
    """``make_model()`` built under `strategy` (`mk.build`), checked to be a compiled model.

    Raises:
        TypeError: it returned something else than a compiled Keras model.
    """
    import keras

    import mirrorkit as mk

    model = mk.build(make_model, strategy, **build_args)
    name = getattr(make_model, "__name__", repr(make_model))
    if not isinstance(model, keras.Model):
        raise TypeError(
            f"{name}() returned {type(model).__name__}, not a Keras model: return the compiled "
            "model, e.g. model.compile(optimizer='adam', loss='mse'); return model"
        )
    if getattr(model, "optimizer", None) is None:
        raise TypeError(
            f"{name}() returned a model that is not compiled: call model.compile(optimizer=..., "
            "loss=...) in it, as for fit"
        )
    return model


def check(make_model: Callable[[], Any], make_data: Callable[[], Any] | None) -> None:
    """Builds the model once, outside any strategy, and checks it and its data before a run.

    Raises:
        TypeError: not a compiled Keras model, or data that is not a ``tf.data.Dataset``.
        ValueError: examples that do not fit the model's inputs.
    """
    import tensorflow as tf

    model = build(make_model, tf.distribute.get_strategy())
    data = examples(model, make_data)
    x, y = next(iter(data.batch(2)))
    try:
        model.train_on_batch(x, y)
    except Exception as error:  # Keras raises ValueError, TypeError or TF's own errors
        given = "--data's examples" if make_data is not None else "the benchmark's random examples"
        raise ValueError(
            f"one training step on {given} failed: {type(error).__name__}: "
            f"{str(error).strip().splitlines()[0]}. Pass data= (--data module:function) returning "
            "a tf.data.Dataset of single (x, y) examples that fit the model and its loss"
        ) from error


def examples(model: Any, make_data: Callable[[], Any] | None):
    """A dataset of single ``(x, y)`` examples for `model`: ``make_data()``'s, or random ones.

    Raises:
        TypeError: ``make_data()`` returned something else than a ``tf.data.Dataset``.
        ValueError: its examples do not fit the model's inputs.
    """
    import tensorflow as tf

    if make_data is None:
        return _synthetic(model)
    name = getattr(make_data, "__name__", repr(make_data))
    data = make_data()
    if not isinstance(data, tf.data.Dataset):
        raise TypeError(
            f"--data {name}() returned {type(data).__name__}, not a tf.data.Dataset: return a "
            "dataset of single (x, y) examples; the benchmark batches them per replica"
        )
    _check_fits(model, data, name)
    return data


def _synthetic(model: Any):
    import numpy as np
    import tensorflow as tf

    def one(tensor, seed):
        shape = tuple(tensor.shape[1:])
        if any(d is None for d in shape):
            raise ValueError(
                f"the model's input {tensor.name!r} has an unknown dimension {shape}: pass "
                "--data module:function returning a tf.data.Dataset of its (x, y) examples"
            )
        rng = np.random.default_rng(seed)
        if "int" in str(tensor.dtype):
            return tf.constant(rng.integers(0, 2, size=shape), dtype=tensor.dtype)
        return tf.constant(rng.normal(size=shape), dtype=tensor.dtype)

    inputs = getattr(model, "inputs", None)
    if not inputs:
        raise ValueError(
            "the model has no keras.Input, so the benchmark cannot make inputs of its shape: "
            "pass --data module:function returning a tf.data.Dataset of its (x, y) examples"
        )
    x = [one(t, i) for i, t in enumerate(inputs)]
    losses = _losses(model, len(model.outputs))
    y = [
        tf.zeros(tuple(t.shape[1:-1]), "int32")
        if "sparse" in loss
        else tf.zeros(tuple(t.shape[1:]), "float32")
        for t, loss in zip(model.outputs, losses, strict=True)
    ]
    example = (x[0] if len(x) == 1 else tuple(x), y[0] if len(y) == 1 else tuple(y))
    return tf.data.Dataset.from_tensors(example)


def _losses(model: Any, outputs: int) -> list[str]:
    """The lowercase name of the loss of each of `outputs` outputs ("" where none is known)."""

    def name(loss: Any) -> str:
        if loss is None:
            return ""
        if isinstance(loss, str):
            return loss.lower()
        return str(
            getattr(loss, "name", None) or getattr(loss, "__name__", None) or type(loss).__name__
        ).lower()

    loss = getattr(model, "loss", None)
    if isinstance(loss, dict):
        names = getattr(model, "output_names", None) or []
        return [name(loss.get(n)) for n in names] if len(names) == outputs else [""] * outputs
    if isinstance(loss, (list, tuple)):
        return [name(each) for each in loss] if len(loss) == outputs else [""] * outputs
    return [name(loss)] * outputs


def _check_fits(model: Any, data: Any, name: str) -> None:
    """Raises ValueError when the examples' input shapes do not match the model's inputs."""
    import tensorflow as tf

    inputs = getattr(model, "inputs", None)
    spec = data.element_spec
    if not inputs or not isinstance(spec, tuple) or len(spec) < 2:
        if not isinstance(spec, tuple) or len(spec) < 2:
            raise ValueError(
                f"--data {name}() gives elements {spec}, not (x, y) examples: map it to "
                "(features, label) pairs"
            )
        return
    given = tf.nest.flatten(spec[0])
    if len(given) != len(inputs):
        raise ValueError(
            f"--data {name}() gives {len(given)} input(s) an example, the model takes {len(inputs)}"
        )
    for index, (got, want) in enumerate(zip(given, inputs, strict=True)):
        expected = tuple(want.shape[1:])
        fits = got.shape.rank is None or (
            got.shape.rank == len(expected)
            and all(
                a is None or b is None or a == b for a, b in zip(got.shape, expected, strict=True)
            )
        )
        if not fits:
            raise ValueError(
                f"--data {name}() gives examples of shape {tuple(got.shape)}, the model's input "
                f"{index} takes {expected} (one example, no batch dimension: the benchmark "
                "batches them)"
            )
