"""Repairs for Keras 3 where it breaks under tf.distribute.

Each repair lives in its own module, names its upstream issue and the Keras
versions it was verified on, and applies only where it is needed.
`apply_for(strategy)` is called by `mk.strategy()`; `enable()` is for users
who build their own `tf.distribute` strategies.
"""

from __future__ import annotations

import tensorflow as tf


def apply_for(strategy: tf.distribute.Strategy) -> list[str]:
    """Applies the repairs that `strategy` needs; returns their names."""
    return []


def prepare_model(model, strategy: tf.distribute.Strategy) -> None:
    """Per-model preparation done by `mk.build` under the strategy's scope."""
