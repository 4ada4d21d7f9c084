"""`HangWatchdog`: a training step that never completes ends the worker, naming the step."""

from __future__ import annotations

import math
import os

import keras

from mirrorkit.cluster import cluster_info
from mirrorkit.environment_variables import MIRRORKIT_HANG_TIMEOUT
from mirrorkit.faults.step_timeout import Watchdog


class HangWatchdog(keras.callbacks.Callback):
    """Ends this worker when no training step completes for ``hang_timeout_s`` seconds.

    Single-host MirroredStrategy has no collective timeout, and a step can block
    without any collective (a deadlocked input pipeline, a ``tf.py_function``
    that never returns), so nothing else ends such a hang. On every worker that
    has it, the watchdog then writes which worker stopped and in which epoch and
    batch, dumps the Python stacks of every thread (`faulthandler`) to stderr
    (the worker's log), and ends the process with exit status 43
    (docs: contracts/#exit-statuses); under
    `mirrorkit launch` the other workers are then stopped and the job fails
    naming that worker. In a multi-worker job the peers of a stuck worker wait
    in the same step's all-reduce, so each one ends the same way: the stacks
    tell the stuck worker (in your code) from those waiting (in TensorFlow).

    The clock starts with `fit` and restarts at each completed step, so the
    first step's tracing counts: give it room. If the step blocks inside
    TensorFlow while holding the GIL, a C thread dumps the stacks 15 s later
    and exits with status 1 (`FAILED`) instead (no message naming the step).

    Args:
        hang_timeout_s: seconds without a completed step; default: the
            ``MIRRORKIT_HANG_TIMEOUT`` variable `mirrorkit launch --hang-timeout`
            sets. With neither, the callback does nothing.

    Raises:
        ValueError: ``hang_timeout_s`` is not a positive number of seconds.

    Example:
    ```python
    import keras
    import numpy as np
    import mirrorkit as mk

    strategy = mk.strategy(cpu_replicas=2)

    def make_model():  # compiled inside the strategy's scope, by mk.build
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        return model

    model = mk.build(make_model, strategy)
    data = mk.distribute((np.ones((64, 4)), np.ones((64, 1))), strategy, global_batch_size=32)
    model.fit(data, epochs=2, callbacks=[mk.callbacks.HangWatchdog(600)])
    ```
    """

    def __init__(self, hang_timeout_s: float | None = None):
        super().__init__()
        source = "hang_timeout_s"
        if hang_timeout_s is None and os.environ.get(MIRRORKIT_HANG_TIMEOUT):
            source = MIRRORKIT_HANG_TIMEOUT
            hang_timeout_s = _float(os.environ[MIRRORKIT_HANG_TIMEOUT])
        if hang_timeout_s is not None and (
            isinstance(hang_timeout_s, bool)
            or not isinstance(hang_timeout_s, (int, float))
            or not math.isfinite(hang_timeout_s)
            or hang_timeout_s <= 0
        ):
            raise ValueError(
                f"HangWatchdog: {source}={hang_timeout_s!r} is not a positive number of "
                "seconds. Give the longest a training step may take, with room for the "
                "first step's tracing, e.g. HangWatchdog(600)."
            )
        self.hang_timeout_s = hang_timeout_s
        self._dog: Watchdog | None = None
        self._epoch = 0

    def on_train_begin(self, logs=None):
        """Starts the clock."""
        if self.hang_timeout_s is None:
            return
        info = cluster_info.from_environment()
        name = f"worker {info.worker_index}" if info.is_multi_worker else "this process"
        self._dog = Watchdog(self.hang_timeout_s, name)
        self._dog.start()

    def on_epoch_begin(self, epoch, logs=None):
        """Notes the epoch, for the message."""
        self._epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        """Notes the step that starts."""
        if self._dog is not None:
            self._dog.entering(batch, f"epoch {self._epoch + 1}, batch {batch}")

    def on_train_batch_end(self, batch, logs=None):
        """Restarts the clock."""
        if self._dog is not None:
            self._dog.completed()

    def on_train_end(self, logs=None):
        """Stops watching."""
        if self._dog is not None:
            self._dog.stop()
            self._dog = None


def _float(text: str) -> object:
    try:
        return float(text)
    except ValueError:
        return text


__all__ = ["HangWatchdog"]
