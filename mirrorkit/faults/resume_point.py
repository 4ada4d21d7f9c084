"""Where a job was when it failed, and where its backup will resume it.

Under `mirrorkit launch`, the chief's `mk.resumable` backup records as it
trains (in the file the launcher names in ``MIRRORKIT_PROGRESS``) the backup
directory, the steps per epoch, and the epoch and step it is on (`Recorder`). When
a worker fails, the launcher reads that file and the backup's own
``training_metadata.json`` (Keras's `BackupAndRestore`) to say where the job
failed, where it will resume, and how many steps are redone. Nothing here
imports TensorFlow or Keras: the launcher reads these files.
"""

from __future__ import annotations

import dataclasses
import json
import mmap
import os
import struct

from mirrorkit import backup_files


@dataclasses.dataclass(frozen=True)
class Position:
    """A point in training: 0-based epoch and the steps completed in it.

    Attributes:
        epoch: 0-based epoch (said 1-based, as Keras's progress bar does).
        step: steps completed in that epoch.
    """

    epoch: int
    step: int

    def __str__(self) -> str:
        return f"epoch {self.epoch + 1} step {self.step}"

    def steps(self, steps_per_epoch: int | None) -> int | None:
        """Steps completed since the start of training, when the epoch length is known."""
        if self.epoch == 0:
            return self.step
        return None if not steps_per_epoch else self.epoch * steps_per_epoch + self.step


@dataclasses.dataclass(frozen=True)
class Progress:
    """What the chief last wrote: the backup directory, epoch length and position.

    Attributes:
        backup_dir: the `mk.resumable` backup directory.
        steps_per_epoch: steps in an epoch, None when Keras did not know it.
        at: the epoch and the step the chief was on (steps completed in it).
        positioned: whether the input resumes at a backup's step (False: at the epoch's
            start, `mirrorkit.feeding.input_position`); None when not known yet.
    """

    backup_dir: str
    steps_per_epoch: int | None
    at: Position
    positioned: bool | None = None


class Recorder:
    """Records the chief's position as it trains, cheaply enough for every step.

    The backup directory and epoch length go to `path` (JSON, written when
    training starts); the epoch and step go to ``path + ".at"``, two 64-bit
    numbers in a shared memory map of the file: a step costs two stores and no
    system call, and what was stored survives the process being SIGKILLed (it
    is in the page cache), which is when the launcher reads it.

    Example:
    ```python
    from mirrorkit.faults import resume_point

    recorder = resume_point.Recorder("p.json", "backup", 4)
    recorder.at(1, 2)
    assert resume_point.read("p.json").at == resume_point.Position(1, 2)
    ```
    """

    def __init__(self, path: str, backup_dir: str, steps_per_epoch: int | None):
        self._path = path
        self._record = {"backup_dir": backup_dir, "steps_per_epoch": steps_per_epoch}
        self._write()
        with open(f"{path}.at", "w+b") as f:
            f.write(bytes(_AT.size))
            f.flush()
            self._map = mmap.mmap(f.fileno(), _AT.size)

    def at(self, epoch: int, step: int) -> None:
        """Stores the 0-based epoch and the steps completed in it."""
        _AT.pack_into(self._map, 0, epoch, step)

    def positioned(self, positioned: bool) -> None:
        """Records whether the input resumes at a backup's step (or at its epoch's start)."""
        if self._record.get("positioned") != positioned:
            self._record["positioned"] = bool(positioned)
            self._write()

    def _write(self) -> None:
        tmp = f"{self._path}.tmp"
        with open(tmp, "w") as f:
            json.dump(self._record, f)
        os.replace(tmp, self._path)


_AT = struct.Struct("<qq")


def read(path: str | None) -> Progress | None:
    """The progress at `path`, or None when there is none (no `mk.resumable`)."""
    if not path:
        return None
    try:
        with open(path) as f:
            record = json.load(f)
        with open(f"{path}.at", "rb") as f:
            epoch, step = _AT.unpack(f.read(_AT.size))
        at = Position(epoch, step)
        return Progress(
            record["backup_dir"], record["steps_per_epoch"], at, record.get("positioned")
        )
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return None


def backup_position(
    backup_dir: str, steps_per_epoch: int | None = None, positioned: bool | None = True
) -> Position | None:
    """Where the backup in `backup_dir` resumes; None without a backup directory.

    The pair a restore reads (`mirrorkit.backup_files.choose`: the latest
    whole one, else the previous one, else none), at its epoch and the steps
    done in it: a step backup resumes at its step where the input is positioned
    (`mirrorkit.feeding.input_position`), else at its epoch's start.

    Args:
        backup_dir: the `mk.resumable` backup directory.
        steps_per_epoch: the epoch length (a backup after an epoch's last step
            resumes at the next epoch's start).
        positioned: whether the input resumes at a backup's step (None: unknown, as True).
    """
    weights = os.path.join(backup_dir, "latest.weights.h5")
    metadata = os.path.join(backup_dir, "training_metadata.json")
    chosen = backup_files.choose(weights, metadata, say=False)[1]
    try:
        epoch, step = backup_files.position(chosen)
    except (OSError, ValueError, KeyError, TypeError):
        return Position(0, 0) if os.path.isdir(backup_dir) else None
    if steps_per_epoch and step >= steps_per_epoch:
        epoch, step = epoch + 1, 0
    return Position(epoch, step if positioned is not False else 0)
