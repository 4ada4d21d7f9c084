"""Repair: only the chief writes checkpoints and backups in a multi-worker job.

Upstream: no report found; docs: compat/#callbacks-that-write-from-every-worker.
Keras 3's callbacks have no notion of a chief
(tf-keras had ``distributed_file_utils``; Keras 3 has none), so under
MultiWorkerMirroredStrategy every worker writes the same paths:
``BackupAndRestore(dir)`` kills the job when one worker's ``makedirs`` raises
``FileExistsError`` or h5py cannot lock ``latest.weights.h5`` that another is
writing, and ``ModelCheckpoint`` has every worker write the same file each
epoch (a race on shared storage).

Every worker holds the same weights after each synchronous step, and reading
a mirrored variable needs no collective, so the chief alone can write: the
replacements skip ``BackupAndRestore``'s save and clean-up and
``ModelCheckpoint``'s save on the other workers. Restoring is unchanged: each
worker reads the chief's backup at the start of ``fit``, which needs the
backup directory on storage every worker sees (one machine, or a shared file
system), as Keras's own multi-worker fault tolerance always has.
"""

from __future__ import annotations

import functools

from mirrorkit.cluster import chief
from mirrorkit.compat._multi_worker import multi_worker_repair

_MODULE_BACKUP = "keras.src.callbacks.backup_and_restore"
_MODULE_CHECKPOINT = "keras.src.callbacks.model_checkpoint"


def _on_chief_only(original):
    @functools.wraps(original)
    def chief_only(self, *args, **kwargs):
        if chief.is_chief():
            return original(self, *args, **kwargs)
        return None

    chief_only.__wrapped__ = original
    return chief_only


_UPSTREAM = "no chief-aware callbacks in Keras 3"
#: The failure's account on the Keras repairs page (docs: compat/), and the tests of
#: this module's repairs (docs: development/#repairs-and-tests is made from them).
_ACCOUNT = "callbacks-that-write-from-every-worker"
_TESTS = (
    "tests/test_multiworker.py::test_backup_and_checkpoint_fail_upstream",
    "tests/test_multiworker.py::test_chief_writes_backups_and_checkpoints_and_every_worker_resumes",
)

REPAIRS = (
    multi_worker_repair(
        "chief_backup_save",
        _UPSTREAM,
        "BackupAndRestore._save_model",
        _on_chief_only,
        module=_MODULE_BACKUP,
        account=_ACCOUNT,
        tests=_TESTS,
        place=1,  # above backup_pair_save: only the chief writes mk.resumable's pair either
        own_canary=True,
    ),
    multi_worker_repair(
        "chief_backup_cleanup",
        _UPSTREAM,
        "BackupAndRestore.on_train_end",
        _on_chief_only,
        module=_MODULE_BACKUP,
        account=_ACCOUNT,
        tests=_TESTS,
        own_canary=True,
    ),
    multi_worker_repair(
        "chief_checkpoint_save",
        _UPSTREAM,
        "ModelCheckpoint._save_model",
        _on_chief_only,
        module=_MODULE_CHECKPOINT,
        account=_ACCOUNT,
        tests=_TESTS,
        own_canary=True,
    ),
)
