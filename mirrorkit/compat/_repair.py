"""One repair of Keras: what it replaces, why, and on which versions it was checked."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any

import keras

from mirrorkit import chief

#: Keras minor versions on which every repair here was run against its test.
VERIFIED_KERAS = ((3, 10), (3, 15))


def spans_replicas(strategy: Any) -> bool:
    """Whether `strategy` runs more than one replica or spans several workers."""
    import tensorflow as tf

    return strategy.num_replicas_in_sync > 1 or isinstance(
        strategy, tf.distribute.MultiWorkerMirroredStrategy
    )


def keras_version() -> tuple[int, int]:
    """Keras's (major, minor) version."""
    major, minor = keras.__version__.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


@dataclasses.dataclass
class Repair:
    """Replaces one attribute of a Keras module or class, reversibly.

    Attributes:
        name: short name, e.g. ``symbolic_build``.
        upstream: the upstream issue or UPSTREAM.md item it repairs.
        module: the dotted module holding the target.
        target: ``"Class.method"`` or ``"function"`` inside `module`.
        replacement: builds the replacement from the original.
        applies_to: whether a given strategy needs it.
    """

    name: str
    upstream: str
    module: str
    target: str
    replacement: Callable[[Any], Any]
    applies_to: Callable[[Any], bool]
    original: Any = None

    @property
    def active(self) -> bool:
        """Whether the replacement is in place."""
        return self.original is not None

    def _owner_and_attr(self) -> tuple[Any, str]:
        owner = importlib.import_module(self.module)
        *path, attr = self.target.split(".")
        for part in path:
            owner = getattr(owner, part)
        return owner, attr

    def apply(self) -> bool:
        """Puts the replacement in place; returns False if it already was."""
        if self.active:
            return False
        owner, attr = self._owner_and_attr()
        if not hasattr(owner, attr):
            chief.warn_once(
                f"repair-missing-{self.name}",
                f"Keras {keras.__version__} has no {self.module}.{self.target}; the "
                f"'{self.name}' repair ({self.upstream}) is not applied. Please report this.",
            )
            return False
        self.original = getattr(owner, attr)
        setattr(owner, attr, self.replacement(self.original))
        return True

    def remove(self) -> None:
        """Restores Keras's original."""
        if self.active:
            owner, attr = self._owner_and_attr()
            setattr(owner, attr, self.original)
            self.original = None
