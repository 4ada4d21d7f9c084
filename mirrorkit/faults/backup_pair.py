"""The `mk.resumable` backup's weights and epoch, written and verified as one.

Keras's `BackupAndRestore` writes two files in turn: the weights
(``latest.weights.h5``) and then the epoch (``training_metadata.json``),
after copying both to ``.bkp`` (``double_checkpoint``). A process killed
between the two left new weights with the old epoch, which Keras resumed (an
epoch trained twice); one killed in the middle of the metadata left a file
Keras could not parse. Here the chief writes the weights, then the epoch with
the SHA-256 of those weights (to a side file, renamed over the old one, so it
is whole or absent), and keeps the previous pair only when it is itself
whole, and writes the steps done in the epoch beside the epoch (``"step"``).
On restore every worker checks the pair before Keras reads it (the
``backup_restore`` repair, `mirrorkit.compat.backup_restore`, for this
callback and Keras's own alike): the latest if its weights match its digest,
else the previous one, else none (a fresh start), said once.

The writing is a repair of ``BackupAndRestore._save_model`` (``backup_pair_save``, in place
from the first `make_atomic`) that acts for the callbacks `make_atomic` was given and leaves
the others to Keras: it composes with the ``chief_backup_save`` repair of the same method
under a multi-worker strategy (which sits above it: only the chief reaches it).

The backup directory is a file system path (local, or shared by every
worker); the weights file is read back once per backup to fingerprint it.
"""

from __future__ import annotations

import os

import keras

from mirrorkit import backup_files, internals
from mirrorkit.cluster.workers import every_strategy
from mirrorkit.patching import attached
from mirrorkit.patching.repair import ON_FIRST_USE, Repair

_INTERNALS = (
    "_weights_path",
    "_training_metadata_path",
    "_current_epoch",
    "_last_batch_seen",
)
#: The `attached` key of a callback whose backup is written as a pair: what it wrote.
_PAIR = "backup_pair.wrote"
_USED_FOR = "mk.resumable's backup written and verified as one"


def make_atomic(callback: keras.callbacks.BackupAndRestore) -> None:
    """Makes `callback` write its pair as one, with the steps done in the epoch.

    Args:
        callback: the `keras.callbacks.BackupAndRestore` of `mk.resumable`; it stays Keras's
            own object (the ``backup_pair_save`` repair of its class writes its pair).

    Example:
    ```python
    import keras
    from mirrorkit.faults import backup_pair

    callback = keras.callbacks.BackupAndRestore("/tmp/run1/backup", double_checkpoint=True)
    backup_pair.make_atomic(callback)
    ```
    """
    for name in (*_INTERNALS, "_save_model"):
        internals.require(callback, name, name=f"keras BackupAndRestore.{name}", used_for=_USED_FOR)
    attached.attach(callback, _PAIR, [])  # this process wrote the latest pair whole: no check
    REPAIR.apply()


def _write_pair(callback: keras.callbacks.BackupAndRestore, wrote: list) -> None:
    """Writes the weights, then the epoch and step with the weights' digest.

    Under a multi-worker strategy only the chief gets here: the ``chief_backup_save`` repair
    of the same method sits above this one (`mirrorkit.compat.chief_files`).
    """
    found = {
        name: internals.require(
            callback, name, name=f"keras BackupAndRestore.{name}", used_for=_USED_FOR
        )
        for name in _INTERNALS
    }
    weights, metadata = found["_weights_path"], found["_training_metadata_path"]
    os.makedirs(callback.backup_dir, exist_ok=True)
    if callback.double_checkpoint and (wrote or backup_files.check(weights, metadata) == "whole"):
        backup_files.keep_previous(weights, metadata)
    callback.model.save_weights(filepath=weights, overwrite=True)
    batch = found["_last_batch_seen"]
    # an integer save_freq saves after a step (batch + 1 done), "epoch" at an epoch's end
    step = batch + 1 if isinstance(callback.save_freq, int) else 0
    position = {"epoch": found["_current_epoch"], "batch": batch, "step": step}
    backup_files.write_metadata(
        metadata, {**position, backup_files.DIGEST: backup_files.digest(weights)}
    )
    wrote.append(True)


def _replacement(original):
    def _save_model(self):
        wrote = attached.attached(self, _PAIR)
        if wrote is None:  # Keras's own callback, not mk.resumable's
            return original(self)
        return _write_pair(self, wrote)

    _save_model.__wrapped__ = original
    return _save_model


REPAIR = Repair(
    name="backup_pair_save",
    upstream="none: Keras writes the weights and the epoch in turn (mk.resumable writes them "
    "as one pair)",
    module="keras.src.callbacks.backup_and_restore",
    target="BackupAndRestore._save_model",
    replacement=_replacement,
    applies_to=every_strategy,
    when=ON_FIRST_USE,
    applied_when="with the first mk.resumable",
    feature="mk.resumable's backup: weights and epoch written by the chief and verified as one",
    account="a-backup-in-the-middle-of-an-epoch",
    tests=(
        "tests/test_restart.py::test_chief_killed_at_each_point_of_its_backup_write_resumes_from_a_whole_pair",
        "tests/test_step_backup.py::test_a_step_backup_resumes_at_its_step_equal_to_an_uninterrupted_run",
    ),
)
