"""Guards for the private TensorFlow and Keras internals mirrorkit touches.

mirrorkit reaches into a few private names (Keras's trainer, a strategy's
communication options, tf.data's dataset classes, ...). Each use goes
through this module: `load_module` and `load` import a private module
(``keras.src...``, ``tensorflow.python...``; no other module of mirrorkit
imports one), `require` reads an attribute that must be there, `optional` one
whose absence turns a feature off with a warning, and `changed` / `warn` say
that one has changed shape. So a TensorFlow or Keras release that renamed or
reshaped one gives a clear error or an explicit warning naming the internal
and the tested versions, never an ``ImportError`` or ``AttributeError`` deep
in a traceback and never a silent no-op. The Keras repairs page (docs: compat/) lists every
internal (``tests/test_architecture.py`` checks both).
"""

from __future__ import annotations

import importlib
import warnings
from types import ModuleType
from typing import Any

from mirrorkit import versions


class InternalChangedError(RuntimeError):
    """A private TensorFlow/Keras internal that mirrorkit needs is missing or changed."""


class InternalChangedWarning(UserWarning):
    """A private internal is missing; mirrorkit carries on without the feature that used it."""


def _message(name: str, used_for: str, problem: str) -> str:
    found = versions.installed()
    return (
        f"mirrorkit uses the private internal {name} ({used_for}), but {problem} in "
        f"TensorFlow {found.tensorflow} / Keras {found.keras}. mirrorkit is tested on "
        f"{versions.tested_range()}; install a tested pair (see docs: compat/) or report "
        "this with `mirrorkit info` output."
    )


def changed(name: str, used_for: str, problem: str = "it is missing") -> InternalChangedError:
    """The error to raise when an internal is missing or has changed shape.

    Args:
        name: the internal, e.g. ``"MirroredStrategy.extended._communication_options"``.
        used_for: what mirrorkit needs it for, e.g. ``"bucket_mb and timeout_s"``.
        problem: what was found wrong, e.g. ``"it has no merge()"``.

    Returns:
        An `InternalChangedError` to raise.
    """
    return InternalChangedError(_message(name, used_for, problem))


#: Private classes a Keras release renamed: the name mirrorkit's repairs and guards use (the
#: tested releases') -> the names later releases use for the same class, newest first.
RENAMED = {
    # keras-nightly 3.16 (the TensorFlow trainer's rewrite, keras-team/keras#23179): the
    # TensorFlow trainer is keras.src.backend.tensorflow.trainer.Trainer, and the
    # backend-independent keras.src.trainers.trainer.Trainer is BaseTrainer.
    "TensorFlowTrainer": ("Trainer",),
}


def renamed(owner: Any, name: str) -> str | None:
    """The name under which `owner` holds the class `name`: itself, or a later name from `RENAMED`.

    Args:
        owner: the module (or class) that holds the class.
        name: the class's name in the tested Keras releases, e.g. ``"TensorFlowTrainer"``.

    Returns:
        `name` or its later name; None when `owner` holds neither.

    Example:
    ```python
    from mirrorkit import internals

    trainer = internals.load_module("keras.src.backend.tensorflow.trainer", used_for="a repair")
    print(internals.renamed(trainer, "TensorFlowTrainer"))  # "Trainer" on Keras 3.16
    ```
    """
    for candidate in (name, *RENAMED.get(name, ())):
        if hasattr(owner, candidate):
            return candidate
    return None


def require(owner: Any, attr: str, *, name: str, used_for: str) -> Any:
    """Returns ``getattr(owner, attr)``, or raises `InternalChangedError` naming it.

    Args:
        owner: the object, class or module that should hold the internal.
        attr: the attribute's name.
        name: how the error names it, e.g. ``"keras TensorFlowTrainer._make_function"``.
        used_for: what mirrorkit needs it for.

    Returns:
        The attribute's value.

    Raises:
        InternalChangedError: `owner` has no `attr`.

    Example:
    ```python
    import tensorflow as tf
    from mirrorkit import internals

    options = internals.require(
        tf.distribute.MirroredStrategy().extended, "_communication_options",
        name="MirroredStrategy.extended._communication_options",
        used_for="bucket_mb and timeout_s",
    )
    ```
    """
    if not hasattr(owner, attr):
        raise changed(name, used_for)
    return getattr(owner, attr)


def load_module(module: str, *, used_for: str) -> ModuleType:
    """Imports the private `module`, or raises `InternalChangedError` naming it.

    Args:
        module: the dotted private module, e.g. ``"keras.src.backend.tensorflow.trainer"``.
        used_for: what mirrorkit needs it for.

    Returns:
        The module (imported once; later calls find it in ``sys.modules``).

    Raises:
        InternalChangedError: the module cannot be imported.

    Example:
    ```python
    from mirrorkit import internals

    trainer = internals.load_module(
        "keras.src.backend.tensorflow.trainer", used_for="the step_function repair"
    )
    ```
    """
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise changed(module, used_for, f"the module cannot be imported ({error})") from error


def optional(owner: Any, attr: str, *, name: str, used_for: str) -> Any:
    """Returns ``getattr(owner, attr)``, or None after an `InternalChangedWarning` naming it.

    For an internal whose absence turns a feature off rather than making it
    wrong: the warning says which feature is off. A missing internal is never
    read as a silent default.

    Args:
        owner: the object, class or module that should hold the internal.
        attr: the attribute's name.
        name: how the warning names it, e.g. ``"keras Trainer._loss_tracker"``.
        used_for: what mirrorkit needs it for, and what is off without it, said in
            the warning.

    Returns:
        The attribute's value, or None when `owner` has no `attr`.

    Example:
    ```python
    import keras
    from mirrorkit import internals

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    start = internals.optional(
        model, "_initial_epoch", name="keras Model._initial_epoch",
        used_for="the epoch in the restart line (it says epoch 1 without it)",
    )
    ```
    """
    if hasattr(owner, attr):
        return getattr(owner, attr)
    warnings.warn(
        _message(name, used_for, "it is missing"),
        InternalChangedWarning,
        stacklevel=2,
    )
    return None


def load(module: str, attr: str, *, used_for: str) -> Any:
    """Returns the private ``module.attr``, or raises `InternalChangedError` naming it.

    Args:
        module: the dotted private module, e.g. ``"keras.src.trainers.data_adapters"``.
        attr: the name inside it.
        used_for: what mirrorkit needs it for.

    Returns:
        The attribute's value.

    Raises:
        InternalChangedError: the module cannot be imported or has no `attr`.

    Example:
    ```python
    from mirrorkit import internals

    make = internals.load(
        "keras.src.trainers.data_adapters.tf_dataset_adapter", "make_class_weight_map_fn",
        used_for="mk.distribute(class_weight=)",
    )
    ```
    """
    try:
        owner = importlib.import_module(module)
    except ImportError as error:
        raise changed(
            f"{module}.{attr}", used_for, f"the module cannot be imported ({error})"
        ) from error
    return require(owner, attr, name=f"{module}.{attr}", used_for=used_for)


def warn(name: str, used_for: str, problem: str = "it is missing") -> None:
    """Warns (an `InternalChangedWarning`) that a feature is off because an internal changed.

    Args:
        name: the internal.
        used_for: the feature that is now off, said in the warning.
        problem: what was found wrong.
    """
    warnings.warn(_message(name, used_for, problem), InternalChangedWarning, stacklevel=3)
