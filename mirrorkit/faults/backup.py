"""`mk.resumable(dir)`: Keras's own `BackupAndRestore`, set up for restarts.

What it sets, so that a user need not know it:

- ``save_freq="epoch"``: Keras 3 restores only the epoch from a backup, so a
  backup taken mid-epoch (``save_freq=N``) resumes that epoch from its first
  step with the weights of its middle: steps trained twice, a different
  result. A backup at each epoch's end resumes exactly.
- ``double_checkpoint=True``, and the weights and epoch written and checked
  as one pair (`mirrorkit.faults.backup_pair`): the previous pair is kept,
  and a backup whose write was cut short (the chief killed at any point of
  it, between the two files included) resumes from the previous pair
  (tested: the chief SIGKILLed half-way through the weights, between the
  weights and the epoch, while keeping the previous pair, and before the
  epoch's file is renamed into place).
- under `mirrorkit launch` (``MIRRORKIT_PROGRESS`` set), the chief records
  the epoch and step it is on, so that the launcher's restart line names
  where the job failed and how many steps are redone.

In a multi-worker job only the chief writes the backup (`mirrorkit.compat`'s
chief-only repair) and every worker restores it, so the directory must be on
storage every worker sees.

Shuffled input: `mk.distribute` shuffles in-memory arrays in an order drawn
from (seed, epoch) (`mirrorkit.pipeline.epoch_order`), and every ``fit``
sets Keras's epoch on it as that epoch begins (with this callback or Keras's
own ``BackupAndRestore``), so a resumed run sees the uninterrupted run's
orders, as long as the seed is the same: the backup does not hold it, so a
drawn seed (``seed=None``) is said on resume (pass ``seed=`` to
`mk.distribute`). A shuffled stream (a tf.data pipeline, tfds files) draws
new orders on resume: said once; ``shuffle=False`` keeps its order.
"""

from __future__ import annotations

import os

import keras

from mirrorkit import internals
from mirrorkit.cluster import chief
from mirrorkit.environment_variables import MIRRORKIT_PROGRESS
from mirrorkit.faults import backup_pair, resume_point
from mirrorkit.patching import instance


def resumable(backup_dir: str) -> keras.callbacks.BackupAndRestore:
    """Keras's `BackupAndRestore` on `backup_dir`, set up to resume exactly after a failure.

    Args:
        backup_dir: where the backup lives; every worker must see it (one
            machine, or a shared file system), and nothing else may write there.

    Returns:
        A `keras.callbacks.BackupAndRestore` with ``save_freq="epoch"`` and
        ``double_checkpoint=True`` (see the module docstring).

    Raises:
        ValueError: `backup_dir` is empty.

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
    model.fit(data, epochs=3, callbacks=[mk.resumable("run1/backup")])  # storage all workers see
    # mirrorkit launch --max-restarts 3 train.py: a failed worker costs the steps since
    # the last epoch's end, not the run
    ```
    """
    if not isinstance(backup_dir, (str, os.PathLike)) or not str(backup_dir):
        raise ValueError(
            f"mk.resumable(backup_dir={backup_dir!r}): give the directory that holds the backup, "
            "on storage every worker sees, e.g. mk.resumable('/shared/run1/backup')."
        )
    callback = keras.callbacks.BackupAndRestore(
        str(backup_dir), save_freq="epoch", double_checkpoint=True
    )
    backup_pair.make_atomic(callback)
    path = os.environ.get(MIRRORKIT_PROGRESS)
    if path and chief.is_chief():
        _record_progress(callback, path)
    return callback


def _record_progress(callback: keras.callbacks.BackupAndRestore, path: str) -> None:
    """Makes `callback` write the chief's epoch and step to `path` as it trains.

    The callback stays Keras's own object: its hooks get a small addition on
    this instance (its class is unchanged).
    """
    restore = callback.on_train_begin
    state = {"epoch": 0, "recorder": None}

    def on_train_begin(logs=None):
        restore(logs)
        steps = (callback.params or {}).get("steps")
        state["recorder"] = resume_point.Recorder(path, callback.backup_dir, steps)
        state["epoch"] = (
            internals.optional(
                callback.model,
                "_initial_epoch",
                name="keras Model._initial_epoch",
                used_for="the epoch a resumed fit starts at, recorded for the launcher's "
                "restart line, which says epoch 1 without it",
            )
            or 0
        )
        state["recorder"].at(state["epoch"], 0)

    begin = callback.on_epoch_begin

    def on_epoch_begin(epoch, logs=None):
        begin(epoch, logs)
        state["epoch"] = epoch
        state["recorder"].at(epoch, 0)

    end_batch = callback.on_train_batch_end

    def on_train_batch_end(batch, logs=None):
        end_batch(batch, logs)
        state["recorder"].at(state["epoch"], batch + 1)

    reason = "mk.resumable records the chief's epoch and step for the launcher's restart line"
    for method in (on_train_begin, on_epoch_begin, on_train_batch_end):
        name = f"backup.progress_{method.__name__}"
        instance.set_on(callback, method.__name__, method, name=name, reason=reason)
