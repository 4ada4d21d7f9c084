"""``TF_USE_LEGACY_KERAS``: mirrorkit keeps Keras 3 where it is set, and says so once.

Ray Train's ``TensorflowTrainer`` sets ``TF_USE_LEGACY_KERAS=1`` in each of its
workers, next to their ``TF_CONFIG`` (Ray's own TensorFlow examples use Keras 2,
the ``tf_keras`` package). The variable changes one thing: what ``tf.keras``
names in a process that first touches ``tf.keras`` after it was set. There
``tf.keras`` is ``tf_keras`` (Keras 2), or an ``ImportError`` ("Keras cannot be
imported") where ``tf_keras`` is not installed. ``import keras`` is Keras 3
either way.

mirrorkit never uses ``tf.keras``: it imports ``keras``, so what it builds,
repairs and trains is Keras 3 whatever the variable says. It leaves the variable
as it is: it is the engine's, and changing it would change what ``tf.keras``
means for the rest of the user's process without their asking. (In Ray's
workers ``tf.keras`` is already Keras 3 before the training function runs: Ray
imports TensorFlow before it sets the variable. A process the training
function starts inherits the variable, and there ``tf.keras`` is Keras 2 or
missing.) `mk.strategy()` says this once, on the chief.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping

from mirrorkit.cluster import chief
from mirrorkit.environment_variables import TF_USE_LEGACY_KERAS

#: The values of TF_USE_LEGACY_KERAS that TensorFlow reads as "use tf_keras for tf.keras".
TRUE_VALUES = ("1", "true", "True")


def requested(env: Mapping[str, str] | None = None) -> bool:
    """Whether `env` asks TensorFlow to route ``tf.keras`` to ``tf_keras`` (Keras 2).

    Args:
        env: the environment to read; `os.environ` when None.

    Returns:
        True when ``TF_USE_LEGACY_KERAS`` holds a value TensorFlow reads as true.

    Example:
    ```python
    from mirrorkit.cluster import legacy_keras

    assert legacy_keras.requested({"TF_USE_LEGACY_KERAS": "1"})
    assert not legacy_keras.requested({})
    ```
    """
    env = os.environ if env is None else env
    return env.get(TF_USE_LEGACY_KERAS) in TRUE_VALUES


def notice(keras_version: str, env: Mapping[str, str] | None = None) -> str | None:
    """The line `mk.strategy()` says when ``TF_USE_LEGACY_KERAS`` is set; None when it is not.

    Args:
        keras_version: the Keras mirrorkit uses (``keras.__version__``).
        env: the environment to read; `os.environ` when None.

    Returns:
        The notice, naming the variable's value, the Keras in use, and what
        ``tf.keras`` means under it.

    Example:
    ```python
    from mirrorkit.cluster import legacy_keras

    line = legacy_keras.notice("3.15.1", {"TF_USE_LEGACY_KERAS": "1"})
    assert line.startswith("TF_USE_LEGACY_KERAS=1 is set (Ray Train sets it)")
    ```
    """
    env = os.environ if env is None else env
    if not requested(env):
        return None
    installed = importlib.util.find_spec("tf_keras") is not None
    legacy = "tf_keras (Keras 2)" if installed else "tf_keras, which is not installed"
    return (
        f"{TF_USE_LEGACY_KERAS}={env[TF_USE_LEGACY_KERAS]} is set (Ray Train sets it); "
        f"mirrorkit uses Keras 3 (keras "
        f"{keras_version}) and leaves the variable as it is: build the model with "
        f"`import keras`. The variable only routes `tf.keras` to {legacy}, in a process "
        "that first uses `tf.keras` after it was set (such as one this process starts); "
        "Keras 2 layers, optimizers and callbacks do not work in a Keras 3 model."
    )


def say_keras_3() -> None:
    """Says `notice` once per process, on the chief, when the variable is set.

    Example:
    ```python
    from mirrorkit.cluster import legacy_keras

    legacy_keras.say_keras_3()  # mk.strategy() calls it
    ```
    """
    import keras

    line = notice(keras.__version__)
    if line is not None:
        chief.say_once(TF_USE_LEGACY_KERAS, line)
