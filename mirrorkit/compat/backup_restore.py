"""Repair: Keras's ``BackupAndRestore`` resumes at the step it backed up, from a whole backup.

Upstream: no report found; docs: compat/#a-backup-in-the-middle-of-an-epoch.
Keras 3's ``BackupAndRestore(save_freq=N)`` backs up every N steps, with the
epoch and the last step in ``training_metadata.json``, but its restore reads
only the epoch (``Model._initial_epoch``): the epoch begins again from its
first step with the weights of its middle, so the steps before the backup are
trained twice (a 2-worker job killed after step 10 of an epoch ended with
``iterations`` 88 for 80 and weights 1.65e-2 from the uninterrupted run's,
Keras 3.15.1). And it trusts whatever it finds: a weights file cut short by a
crash or a full disk stops every restart with h5py's "truncated file" naming
neither the file nor the backup, and weights without their metadata file
resume at epoch 1 with the later weights, silently.

The replacement of ``BackupAndRestore._load_model``:

- reads the latest pair only if it is whole (`mirrorkit.backup_files`:
  ``mk.resumable``'s pairs carry their weights' SHA-256, Keras's own are
  opened with h5py), else the previous one (``double_checkpoint``), else none:
  training starts from the beginning; either is said once on the chief;
- hands the backup's epoch and step to `mirrorkit.feeding.input_position`,
  whose epoch iterator reads and drops the batches of the steps already
  trained, so the resumed run takes the batches an uninterrupted run takes
  (where the input gives the same batches in a new process; other inputs
  resume at the epoch's start, said with the fix);
- leaves a later position restored in the same ``fit`` (a
  `mk.PreemptionCheckpoint` saved after the backup) in place, and says so.

Backups at each epoch's end (``save_freq="epoch"``) resume at that epoch's
start, as in Keras.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile

from mirrorkit import backup_files
from mirrorkit.cluster.workers import every_strategy
from mirrorkit.feeding import input_position
from mirrorkit.patching.repair import Repair


def _load_model(original):
    @functools.wraps(original)
    def load_model(self):
        weights, metadata = self._weights_path, self._training_metadata_path
        steps_in_batch_key = isinstance(self.save_freq, int)
        chosen_weights, chosen_metadata = backup_files.choose(
            weights, metadata, steps_in_batch_key=steps_in_batch_key
        )
        at = None
        if os.path.exists(chosen_metadata):
            at = backup_files.position(chosen_metadata, steps_in_batch_key)
            steps = (self.params or {}).get("steps")
            if steps and at[1] >= steps:  # backed up after the epoch's last step
                at = (at[0] + 1, 0)
            if input_position.held_later(self.model, *at, f"the backup in {self.backup_dir}"):
                return None  # a later position (a preemption checkpoint) is restored already
        with tempfile.TemporaryDirectory(prefix="mirrorkit-restore-") as local:
            if chosen_weights != weights and os.path.exists(chosen_weights):
                # Keras loads only files named *.weights.h5: a private copy, nothing written there
                loadable = os.path.join(local, "previous.weights.h5")
                shutil.copyfile(chosen_weights, loadable)
                chosen_weights = loadable
            self._weights_path, self._training_metadata_path = chosen_weights, chosen_metadata
            try:
                result = original(self)
            finally:
                self._weights_path, self._training_metadata_path = weights, metadata
        if at is not None:
            input_position.resume_at(self.model, *at, f"the backup in {self.backup_dir}")
        return result

    load_model.__wrapped__ = original
    return load_model


REPAIR = Repair(
    name="backup_restore",
    upstream="none found (docs: compat/#a-backup-in-the-middle-of-an-epoch)",
    module="keras.src.callbacks.backup_and_restore",
    target="BackupAndRestore._load_model",
    replacement=_load_model,
    applies_to=every_strategy,
    account="a-backup-in-the-middle-of-an-epoch",
    tests=(
        "tests/test_step_backup.py::test_a_step_backup_resumes_at_its_step_equal_to_an_uninterrupted_run",
        "tests/test_step_backup.py::test_a_damaged_keras_backup_resumes_from_the_previous_or_says_so",
        "tests/test_step_backup.py::test_two_workers_killed_mid_epoch_resume_from_step_backups",
        # its canary: plain Keras's step backup trains the steps before it twice
        "tests/test_step_backup.py::test_keras_step_backup_trains_steps_twice_upstream",
    ),
)
