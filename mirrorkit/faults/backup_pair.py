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

The backup directory is a file system path (local, or shared by every
worker); the weights file is read back once per backup to fingerprint it.
"""

from __future__ import annotations

import os

import keras

from mirrorkit import backup_files, internals
from mirrorkit.cluster import chief
from mirrorkit.patching import instance

_INTERNALS = (
    "_weights_path",
    "_training_metadata_path",
    "_save_model",
    "_current_epoch",
    "_last_batch_seen",
)


def make_atomic(callback: keras.callbacks.BackupAndRestore) -> None:
    """Makes `callback` write its pair as one, with the steps done in the epoch.

    Args:
        callback: the `keras.callbacks.BackupAndRestore` of `mk.resumable`; its
            class is unchanged, its ``_save_model`` is replaced on this instance.

    Example:
    ```python
    import keras
    from mirrorkit.faults import backup_pair

    callback = keras.callbacks.BackupAndRestore("/tmp/run1/backup", double_checkpoint=True)
    backup_pair.make_atomic(callback)
    ```
    """
    found = {
        name: internals.require(
            callback,
            name,
            name=f"keras BackupAndRestore.{name}",
            used_for="mk.resumable's backup written and verified as one",
        )
        for name in _INTERNALS
    }
    weights, metadata = found["_weights_path"], found["_training_metadata_path"]
    wrote = []  # this process wrote the latest pair whole (no need to check it again)

    def save_model():
        if not chief.is_chief():  # every worker holds the same weights; the chief writes
            return
        os.makedirs(callback.backup_dir, exist_ok=True)
        if callback.double_checkpoint and (
            wrote or backup_files.check(weights, metadata) == "whole"
        ):
            backup_files.keep_previous(weights, metadata)
        callback.model.save_weights(filepath=weights, overwrite=True)
        batch = callback._last_batch_seen
        # an integer save_freq saves after a step (batch + 1 done), "epoch" at an epoch's end
        step = batch + 1 if isinstance(callback.save_freq, int) else 0
        position = {"epoch": callback._current_epoch, "batch": batch, "step": step}
        backup_files.write_metadata(
            metadata, {**position, backup_files.DIGEST: backup_files.digest(weights)}
        )
        wrote.append(True)

    reason = "mk.resumable's backup: weights and epoch written by the chief and verified as one"
    instance.set_on(callback, "_save_model", save_model, name="backup_pair.save", reason=reason)
