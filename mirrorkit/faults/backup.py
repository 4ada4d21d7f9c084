"""`mk.resumable(dir)`: Keras's own `BackupAndRestore`, set up for restarts.

What it sets, so that a user need not know it:

- when it backs up: at each epoch's end (``save_freq="epoch"``, the default),
  every N steps (``every=N``: ``save_freq=N``), or every so many minutes of
  training (``every=datetime.timedelta(minutes=10)``: the chief's clock is
  read after each step, and a backup is written after the first step past the
  interval). A backup in the middle of an epoch resumes at its step (the
  ``backup_restore`` repair, which `mk.strategy()` and ``mk.compat.enable``
  apply, and `mirrorkit.feeding.input_position`, for Keras's own
  ``BackupAndRestore(save_freq=N)`` too); the write blocks
  training for as long as it takes (docs: benchmarks/ gives the cost);
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

import datetime
import os
import time

import keras

from mirrorkit import internals
from mirrorkit.cluster import chief
from mirrorkit.environment_variables import MIRRORKIT_PROGRESS
from mirrorkit.faults import backup_pair, resume_point
from mirrorkit.feeding import input_position
from mirrorkit.patching import instance


def resumable(
    backup_dir: str, every: int | datetime.timedelta | str = "epoch"
) -> keras.callbacks.BackupAndRestore:
    """Keras's `BackupAndRestore` on `backup_dir`, set up to resume exactly after a failure.

    Args:
        backup_dir: where the backup lives; every worker must see it (one
            machine, or a shared file system), and nothing else may write there.
        every: when to back up: ``"epoch"`` (at each epoch's end), a number of
            steps (``500``), or a `datetime.timedelta` of training time
            (``timedelta(minutes=10)``). A restarted job resumes at the step of
            its last backup, with the batch an uninterrupted run would take next.

    Returns:
        A `keras.callbacks.BackupAndRestore` with ``double_checkpoint=True`` and
        the ``save_freq`` of `every` (see the module docstring).

    Raises:
        ValueError: `backup_dir` is empty, or `every` is none of the above.

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
    # the last backup, not the run; mk.resumable("run1/backup", every=100) backs up
    # every 100 steps
    ```
    """
    if not isinstance(backup_dir, (str, os.PathLike)) or not str(backup_dir):
        raise ValueError(
            f"mk.resumable(backup_dir={backup_dir!r}): give the directory that holds the backup, "
            "on storage every worker sees, e.g. mk.resumable('/shared/run1/backup')."
        )
    interval = _interval(every)
    save_freq = every if isinstance(every, int) else 1 if interval else "epoch"
    callback = keras.callbacks.BackupAndRestore(
        str(backup_dir), save_freq=save_freq, double_checkpoint=True
    )
    backup_pair.make_atomic(callback)
    if interval:
        _every_interval(callback, interval)
    path = os.environ.get(MIRRORKIT_PROGRESS)
    if path and chief.is_chief():
        _record_progress(callback, path)
    return callback


def _interval(every: object) -> float:
    """The seconds between backups of `every`, 0 for steps or epochs; raises on anything else."""
    if isinstance(every, datetime.timedelta) and every.total_seconds() > 0:
        return every.total_seconds()
    if every == "epoch" or (isinstance(every, int) and not isinstance(every, bool) and every > 0):
        return 0.0
    raise ValueError(
        f"mk.resumable(every={every!r}): give 'epoch' (a backup at each epoch's end), a number "
        "of steps (every=500), or a datetime.timedelta of training time "
        "(every=datetime.timedelta(minutes=10))."
    )


def _every_interval(callback: keras.callbacks.BackupAndRestore, seconds: float) -> None:
    """Makes `callback` (``save_freq=1``) back up after the first step past each interval."""
    internals.require(  # Keras's own count of the steps, kept up (called below)
        callback,
        "_should_save_on_batch",
        name="keras BackupAndRestore._should_save_on_batch",
        used_for="mk.resumable(every=timedelta(...)), a backup every so many minutes",
    )
    last = [time.monotonic()]

    def wrapper(counts):
        def should_save_on_batch(batch):
            counts(batch)
            if time.monotonic() - last[0] < seconds:
                return False
            last[0] = time.monotonic()
            return True

        return should_save_on_batch

    instance.wrap(
        callback,
        "_should_save_on_batch",
        wrapper,
        name="backup.every_interval",
        reason="mk.resumable(every=timedelta(...)) backs up after the first step past each "
        "interval of training time",
    )


def _record_progress(callback: keras.callbacks.BackupAndRestore, path: str) -> None:
    """Makes `callback` write the chief's epoch and step to `path` as it trains.

    The callback stays Keras's own object: its hooks get a small addition on
    this instance (its class is unchanged), around what its class does when called.
    """
    state = {"epoch": 0, "recorder": None}

    def on_train_begin(below):
        def on_train_begin(logs=None):
            below(logs)
            steps = (callback.params or {}).get("steps")
            state["recorder"] = resume_point.Recorder(path, callback.backup_dir, steps)
            input_position.watch(callback.model)
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

        return on_train_begin

    def on_epoch_begin(below):
        def on_epoch_begin(epoch, logs=None):
            below(epoch, logs)
            state["epoch"] = epoch
            state["recorder"].at(epoch, 0)

        return on_epoch_begin

    def on_train_batch_end(below):
        def on_train_batch_end(batch, logs=None):
            below(batch, logs)
            state["recorder"].at(state["epoch"], batch + 1)
            verdict = input_position.training_input(callback.model)
            if verdict is not None:  # whether a restart resumes at the backup's step
                state["recorder"].positioned(verdict.positionable)

        return on_train_batch_end

    reason = "mk.resumable records the chief's epoch and step for the launcher's restart line"
    for wrapper in (on_train_begin, on_epoch_begin, on_train_batch_end):
        name = f"backup.progress_{wrapper.__name__}"
        instance.wrap(callback, wrapper.__name__, wrapper, name=name, reason=reason)
