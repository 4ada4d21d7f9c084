"""The TensorFlow/Keras pairs mirrorkit is tested on, and whether this one is among them.

This module is the one place that states the tested range. `mirrorkit info`
prints it, the compat repairs warn outside it, and `mirrorkit.internals`
names it when a private TensorFlow or Keras internal is missing. The range is
what CI's version matrix runs (``.ci/run``; see ``docs/compat.md``).
"""

from __future__ import annotations

import dataclasses
from importlib import metadata

#: The exact (TensorFlow, Keras) pairs CI's matrix installs, oldest first; each
#: is pinned in ``ci/constraints-<leg>.txt`` (a test checks they agree).
MATRIX = {
    "oldest": ("2.17.1", "3.10.0"),
    "middle": ("2.19.1", "3.10.0"),
    "newest": ("2.21.0", "3.15.1"),
}


def parse(version: str) -> tuple[int, int]:
    """``"2.21.0"`` -> ``(2, 21)``; ``"3.15.1.dev0"`` -> ``(3, 15)``."""
    parts = version.split(".")
    major = int("".join(c for c in parts[0] if c.isdigit()) or 0)
    minor = int("".join(c for c in (parts[1] if len(parts) > 1 else "0") if c.isdigit()) or 0)
    return major, minor


#: (major, minor) of the oldest and newest TensorFlow that CI's matrix runs.
TESTED_TENSORFLOW = (
    min(parse(tf) for tf, _ in MATRIX.values()),
    max(parse(tf) for tf, _ in MATRIX.values()),
)
#: (major, minor) of the oldest and newest Keras that CI's matrix runs.
TESTED_KERAS = (
    min(parse(k) for _, k in MATRIX.values()),
    max(parse(k) for _, k in MATRIX.values()),
)


def _label(bounds: tuple[tuple[int, int], tuple[int, int]]) -> str:
    low, high = (f"{a}.{b}" for a, b in bounds)
    return f"{low}-{high}"


def tested_range() -> str:
    """E.g. ``"TensorFlow 2.17-2.21 with Keras 3.10-3.15"``."""
    return f"TensorFlow {_label(TESTED_TENSORFLOW)} with Keras {_label(TESTED_KERAS)}"


def _installed(distribution: str, *alternatives: str) -> str | None:
    for name in (distribution, *alternatives):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


@dataclasses.dataclass(frozen=True)
class Installed:
    """The installed TensorFlow and Keras, and whether CI tests this pair's range.

    Attributes:
        tensorflow: TensorFlow's version string, or None if not installed.
        keras: Keras's version string, or None if not installed.
    """

    tensorflow: str | None
    keras: str | None

    @property
    def newer_than_tested(self) -> bool:
        """Whether TensorFlow or Keras is newer than the newest pair CI runs."""
        return (self.tensorflow is not None and parse(self.tensorflow) > TESTED_TENSORFLOW[1]) or (
            self.keras is not None and parse(self.keras) > TESTED_KERAS[1]
        )

    @property
    def in_tested_range(self) -> bool:
        """Whether both versions lie inside the range CI's matrix runs."""
        if self.tensorflow is None or self.keras is None:
            return False
        tf_low, tf_high = TESTED_TENSORFLOW
        k_low, k_high = TESTED_KERAS
        return tf_low <= parse(self.tensorflow) <= tf_high and k_low <= parse(self.keras) <= k_high

    def describe(self) -> str:
        """One line: the pair and whether it is inside the tested range."""
        pair = f"TensorFlow {self.tensorflow or 'missing'}, Keras {self.keras or 'missing'}"
        if self.in_tested_range:
            return f"{pair}: inside the tested range ({tested_range()})"
        return (
            f"{pair}: OUTSIDE the tested range ({tested_range()}); mirrorkit may still "
            "work, see docs/compat.md"
        )


def installed() -> Installed:
    """The installed pair, read from package metadata (imports no TensorFlow).

    Returns:
        An `Installed` value.

    Example:
    ```python
    from mirrorkit import versions

    print(versions.installed().describe())
    ```
    """
    return Installed(
        tensorflow=_installed("tensorflow", "tensorflow-cpu", "tf-nightly", "tensorflow-intel"),
        keras=_installed("keras", "keras-nightly"),
    )
