"""`mk.build`: the model, its optimizer state and metrics, created under a strategy's scope."""

from __future__ import annotations

from collections.abc import Callable

import keras
import tensorflow as tf

from mirrorkit import compat
from mirrorkit.cluster import chief, workers
from mirrorkit.compat.multi_worker_reduce import LOCAL_STEP_LOGS
from mirrorkit.patching import attached
from mirrorkit.scale import batchnorm
from mirrorkit.strategies import current
from mirrorkit.training import compression

#: What `build`'s ``step_logs`` accepts.
STEP_LOGS = ("averaged", "local")


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
            `mk.strategy()` made last, else TensorFlow's default.
        gradient_compression: ``"fp16"`` or ``"bf16"`` all-reduces float32
            gradients in 16 bits (half the bytes, less precision; docs:
            throughput/#communication-bound); None (the default) keeps float32.
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
    chosen = strategy or current.current_strategy()
    with chosen.scope():
        model = model_fn()
        if not isinstance(model, keras.Model):
            raise TypeError(
                f"model_fn must return a keras.Model; it returned {type(model).__name__}"
            )
        compat.prepare_model(model, chosen)
    batchnorm.check(model, chosen)
    _set_step_logs(chosen, step_logs)
    if gradient_compression is not None:
        compression.apply(model, gradient_compression, chosen)
    return model


def _set_step_logs(chosen: tf.distribute.Strategy, step_logs: str) -> None:
    local = step_logs == "local" and workers.is_multi_worker(chosen)
    attached.attach(chosen, LOCAL_STEP_LOGS, local)
    if local:
        chief.say_once(
            "step-logs-local",
            "per-step logs (progress bar, on_train_batch_end) are this worker's own "
            "(step_logs='local'): no cross-worker collective per step; epoch logs and History "
            "are averaged over every replica",
        )
