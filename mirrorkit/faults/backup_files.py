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
    """``"whole"``, ``"trusted"`` (no digest: plain Keras's), ``"none"`` or ``"cut short"``."""
    if not os.path.exists(metadata):
        return "none" if not os.path.exists(weights) else "cut short"
    try:
        with open(metadata) as f:
            record = json.load(f)
        int(record["epoch"])
    except (OSError, ValueError, KeyError, TypeError):
        return "cut short"
    if DIGEST not in record:
        return "trusted"
    if not os.path.exists(weights) or digest(weights) != record[DIGEST]:
        return "cut short"
    return "whole"


def choose(weights: str, metadata: str) -> tuple[str, str]:
    """The (weights, metadata) paths Keras should restore: the latest whole pair, or none."""
    latest = check(weights, metadata)
    if latest in ("whole", "trusted", "none"):
        return weights, metadata
    previous = (f"{weights}.bkp", f"{metadata}.bkp")
    if check(*previous) in ("whole", "trusted"):
        chief.say_once(
            "backup-cut-short",
            f"the latest backup in {os.path.dirname(weights)} was cut short (its weights and "
            f"epoch do not match): resuming from the previous one, at epoch {_epoch(previous[1])}",
        )
        return previous
    chief.say_once(
        "backup-cut-short",
        f"the only backup in {os.path.dirname(weights)} was cut short (its weights and epoch "
        "do not match) and there is no previous one: training starts from the beginning",
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


def _epoch(metadata: str) -> int:
    """The 1-based epoch a metadata file resumes at (Keras stores the 0-based one)."""
    with open(metadata) as f:
        return int(json.load(f)["epoch"]) + 1
