"""Repair: Keras's step backups in a resumed epoch record that epoch, not epoch 0.

Upstream: no report found; docs: compat/#the-epoch-a-resumed-fit-is-in.
Keras 3's ``BackupAndRestore(save_freq=N)`` writes ``_current_epoch``
into each step backup's ``training_metadata.json``, and sets it only at an
epoch's end (to the next epoch). A run resumed from a backup builds a new
callback, whose ``_current_epoch`` is 0 until its first epoch ends: every
step backup of the resumed epoch says epoch 0 (seen with Keras 3.15.1), so a
second failure there (``mirrorkit launch --max-restarts``) resumes at epoch 1
with that epoch's later weights, and the epochs before are trained again.

The replacement of ``BackupAndRestore.on_epoch_begin`` (Keras's is the
no-op of ``Callback``) sets ``_current_epoch`` to the epoch ``fit`` begins,
which is what Keras sets it to at the end of the epoch before in an
uninterrupted run. Backups per epoch (``save_freq="epoch"``, `mk.resumable`)
are unaffected.
"""

from __future__ import annotations

import functools

from mirrorkit import internals
from mirrorkit.cluster.workers import every_strategy
from mirrorkit.patching.repair import Repair


def _on_epoch_begin(original):
    @functools.wraps(original)
    def on_epoch_begin(self, epoch, logs=None):
        original(self, epoch, logs)
        internals.require(
            self,
            "_current_epoch",
            name="keras BackupAndRestore._current_epoch",
            used_for="the epoch a step backup of a resumed epoch records",
        )
        self._current_epoch = epoch

    on_epoch_begin.__wrapped__ = original
    return on_epoch_begin


REPAIR = Repair(
    name="backup_step_epoch",
    upstream="none found (docs: compat/#the-epoch-a-resumed-fit-is-in)",
    module="keras.src.callbacks.backup_and_restore",
    target="BackupAndRestore.on_epoch_begin",
    replacement=_on_epoch_begin,
    applies_to=every_strategy,  # Keras's bug on one device too
    account="the-epoch-a-resumed-fit-is-in",
    tests=(
        "tests/test_restart.py::test_the_tutorials_keras_backup_resumes_a_shuffled_input_in_its_uninterrupted_orders",
        "tests/test_rescale.py::test_keras_own_backup_and_initial_epoch_resume_a_shuffled_input_in_its_orders",
        "tests/test_rescale.py::test_keras_step_backups_in_a_resumed_epoch_record_that_epoch",
        # its canary: plain Keras's step backups in a resumed epoch say epoch 0
        "tests/test_compat.py::test_keras_step_backups_in_a_resumed_epoch_record_epoch_0_upstream",
    ),
)
