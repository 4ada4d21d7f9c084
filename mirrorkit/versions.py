"""The TensorFlow/Keras pairs mirrorkit is tested on, and whether this one is among them.

This module is the one place that states the tested range. `mirrorkit info`
prints it, the compat repairs warn outside it, and `mirrorkit.internals`
names it when a private TensorFlow or Keras internal is missing. The range is
what CI's version matrix runs (``.ci/run``; see docs: compat/).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from importlib import metadata

#: The exact (TensorFlow, Keras) pairs CI's matrix installs, oldest first; each
#: is pinned in ``ci/constraints-<leg>.txt`` (a test checks they agree).
MATRIX = {
    "oldest": ("2.17.1", "3.10.0"),
    "middle": ("2.19.1", "3.10.0"),
    "newest": ("2.21.0", "3.15.1"),
}


#: The nightly pair CI's "next" leg runs (``ci/constraints-next.txt``; `ci/refresh-next.sh`
#: moves it to the newest nightlies): tf-nightly-cpu and keras-nightly, pinned by date. It is
#: tested, but not a release: the tested range above stays the releases'.
NEXT = ("2.22.0.dev20260905", "3.16.0.dev2026102704")


def normalized(version: str) -> str:
    """A version as pip writes it: ``tf.__version__`` 2.22.0-dev20260905 is 2.22.0.dev20260905."""
    return version.replace("-dev", ".dev")


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


def _installed(package: str) -> str | None:
    """The version of the importable `package`, without importing it.

    The module's own ``__version__`` when it is imported already (``tf.__version__``);
    else the version of whichever distribution installed it: TensorFlow ships as
    ``tensorflow``, ``tensorflow-cpu``, ``tf-nightly``, ``tf-nightly-cpu`` and others,
    Keras as ``keras`` and ``keras-nightly``.
    """
    module = sys.modules.get(package)
    version = getattr(module, "__version__", None)  # public; None while it is being imported
    if isinstance(version, str):
        return version
    for distribution in _distributions().get(package, ()):
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return None


@functools.lru_cache(maxsize=1)
def _distributions() -> dict[str, list[str]]:
    """Top-level package -> the distributions that install it (read once, no imports)."""
    return metadata.packages_distributions()


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
    def is_next(self) -> bool:
        """Whether this is exactly the nightly pair CI's "next" leg runs (`NEXT`)."""
        if self.tensorflow is None or self.keras is None:
            return False
        return (normalized(self.tensorflow), normalized(self.keras)) == NEXT

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
        if self.is_next:
            return (
                f"{pair}: the nightly pair CI's 'next' leg tests (newer than the tested "
                f"releases, {tested_range()}); see docs: versions/"
            )
        return (
            f"{pair}: OUTSIDE the tested range ({tested_range()}); mirrorkit may still "
            "work, see docs: compat/"
        )


def installed() -> Installed:
    """The installed pair, without importing TensorFlow.

    The modules' own versions when they are imported, else the metadata of
    whichever distribution installed them (``tf-nightly-cpu`` too).

    Returns:
        An `Installed` value.

    Example:
    ```python
    from mirrorkit import versions

    print(versions.installed().describe())
    ```
    """
    return Installed(tensorflow=_installed("tensorflow"), keras=_installed("keras"))
