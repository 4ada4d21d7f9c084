"""A 2-worker job of a test's training script under ``mirrorkit launch``, as a user runs it.

The script is formatted with ``tests=`` (this folder, for its imports) and run as
``mirrorkit launch -n 2 --no-pin FLAGS script BACKUP_DIR OUT MODE``: the backup directory
``backup-MODE`` and the chief's result ``MODE.npy`` in `tmp_path`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

TESTS = str(Path(__file__).parent)


def launch(tmp_path: Path, script: str, mode: str, *flags: str):
    """Runs `script` on 2 local workers; returns (the finished process, the result's path)."""
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(script.format(tests=TESTS)))
    out = tmp_path / f"{mode}.npy"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    done = subprocess.run(
        [sys.executable, "-m", "mirrorkit", "launch", "-n", "2", "--no-pin", *flags]
        + [str(path), str(tmp_path / f"backup-{mode}"), str(out), mode],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    return done, out
