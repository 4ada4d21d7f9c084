"""A backup directory's files, read and written without TensorFlow or Keras.

Keras's `BackupAndRestore` keeps the weights (``latest.weights.h5``) and the
epoch (``training_metadata.json``), and with ``double_checkpoint`` the previous
pair beside them (``.bkp``). Here: whether a pair is whole (`check`), which
pair a restore should read (`choose`), and the writes that keep each file
whole or absent (`keep_previous`, `write_metadata`). The launcher reads a
backup through these too (`mirrorkit.faults.resume_point`), so nothing here
imports TensorFlow or Keras.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil

from mirrorkit.cluster import chief

DIGEST = "weights_sha256"  # the metadata's key for its weights' digest


def check(weights: str, metadata: str) -> str:
    """The state of one pair: "whole", "trusted", "none", "cut short" or "damaged".

    ``"whole"``: its weights match the digest in its metadata (mk.resumable's).
    ``"trusted"``: no digest (plain Keras wrote it), and its weights file can be read.
    ``"none"``: neither file. ``"cut short"``: weights without a metadata file that can be
    read, or weights that do not match their digest. ``"damaged"``: no digest, and the
    weights file cannot be read (a write cut short by a crash or a full disk).
    """
    if not os.path.exists(metadata):
        return "none" if not os.path.exists(weights) else "cut short"
    try:
        with open(metadata) as f:
            record = json.load(f)
        int(record["epoch"])
    except (OSError, ValueError, KeyError, TypeError):
        return "cut short"
    if DIGEST not in record:
        if os.path.exists(weights) and unreadable(weights):
            return "damaged"
        return "trusted"
    if not os.path.exists(weights) or digest(weights) != record[DIGEST]:
        return "cut short"
    return "whole"


def unreadable(weights: str) -> str:
    """Why the HDF5 weights file at `weights` cannot be read ("" when it can).

    Opens it and walks its groups with h5py (Keras's own reader of ``.weights.h5``).
    """
    import h5py  # a dependency of Keras; imported here so the launcher pays for it on failure only

    try:
        with h5py.File(weights, "r") as f:
            f.visit(lambda name: None)
    except (OSError, ValueError, RuntimeError, KeyError) as error:
        return str(error) or type(error).__name__
    return ""


def position(metadata: str, steps_in_batch_key: bool = False) -> tuple[int, int]:
    """The 0-based epoch and the steps completed in it that the metadata at `metadata` holds.

    Args:
        metadata: a ``training_metadata.json``.
        steps_in_batch_key: whether its ``"batch"`` is the last step backed up (Keras's
            ``BackupAndRestore`` with an integer ``save_freq``: steps done = batch + 1).
            mirrorkit's backups write the steps done as ``"step"``, read first.

    Returns:
        ``(epoch, step)``; ``(epoch, 0)`` for a backup at an epoch's end.
    """
    with open(metadata) as f:
        record = json.load(f)
    epoch = int(record["epoch"])
    if "step" in record:
        return epoch, int(record["step"])
    if steps_in_batch_key and "batch" in record:
        return epoch, int(record["batch"]) + 1
    return epoch, 0


def choose(
    weights: str, metadata: str, say: bool = True, steps_in_batch_key: bool = False
) -> tuple[str, str]:
    """The (weights, metadata) paths Keras should restore: the latest whole pair, or none.

    Args:
        weights: the latest weights file (``latest.weights.h5``).
        metadata: the latest metadata file (``training_metadata.json``).
        say: say once on the chief which pair is restored when it is not the latest
            (the launcher reads quietly).
        steps_in_batch_key: as in `position`, for where the previous pair resumes.
    """
    latest = check(weights, metadata)
    if latest in ("whole", "trusted", "none"):
        return weights, metadata
    what = "was cut short (its weights and epoch do not match)"
    if latest == "damaged":
        what = f"is damaged ({os.path.basename(weights)} cannot be read: {unreadable(weights)})"
    previous = (f"{weights}.bkp", f"{metadata}.bkp")
    if check(*previous) in ("whole", "trusted"):
        if say:
            chief.say_once(
                "backup-cut-short",
                f"the latest backup in {os.path.dirname(weights)} {what}: resuming from the "
                f"previous one, at {_said(previous[1], steps_in_batch_key)}",
            )
        return previous
    if say:
        chief.say_once(
            "backup-cut-short",
            f"the only backup in {os.path.dirname(weights)} {what} and there is no previous "
            "one: training starts from the beginning",
        )
    absent = os.path.join(os.path.dirname(weights), ".mirrorkit-no-backup")
    return absent, absent


def keep_previous(weights: str, metadata: str) -> None:
    """Copies the whole latest pair to ``.bkp``, each file whole or not at all."""
    for path in (weights, metadata):
        shutil.copyfile(path, f"{path}.bkp.tmp")
        os.replace(f"{path}.bkp.tmp", f"{path}.bkp")


def write_metadata(metadata: str, record: dict) -> None:
    """Writes Keras's metadata file whole (a side file renamed over the old one)."""
    tmp = f"{metadata}.tmp"
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, metadata)


def digest(path: str) -> str:
    """The SHA-256 of the file at `path`, in hex."""
    sha = hashlib.sha256()  # hashlib.file_digest is Python 3.11+; mirrorkit supports 3.10
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def _said(metadata: str, steps_in_batch_key: bool) -> str:
    """Where a metadata file resumes, 1-based as Keras's progress bar says it: ``epoch 2``."""
    epoch, step = position(metadata, steps_in_batch_key)
    return f"epoch {epoch + 1}" + (f" step {step}" if step else "")
