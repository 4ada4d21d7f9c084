"""The current strategy: which strategy `mk.build`, `mk.describe` and `mk.distribute` use.

`mk.strategy()` records each strategy it makes here, keyed by the request, so
that the same request (a notebook cell run twice) returns the same strategy,
and the last one made is the default for the functions that take
``strategy=None``. No TensorFlow work happens on import.
"""

from __future__ import annotations

from collections.abc import Hashable

import tensorflow as tf

_made: dict[Hashable, tf.distribute.Strategy] = {}
_last: list[tf.distribute.Strategy] = []


def current_strategy() -> tf.distribute.Strategy:
    """The strategy in scope, else the one `mk.strategy()` made last, else the default.

    Returns:
        A `tf.distribute.Strategy`.

    Example:
    ```python
    import mirrorkit as mk
    from mirrorkit.strategies.current import current_strategy

    made = mk.strategy(cpu_replicas=2)
    assert current_strategy() is made
    ```
    """
    if tf.distribute.has_strategy():
        return tf.distribute.get_strategy()
    if _last:
        return _last[0]
    return tf.distribute.get_strategy()


def lookup(key: Hashable) -> tf.distribute.Strategy | None:
    """The strategy made for `key` earlier in this process (now current), or None."""
    made = _made.get(key)
    if made is not None:
        _last[:] = [made]
    return made


def remember(key: Hashable, made: tf.distribute.Strategy) -> None:
    """Records `made` as the strategy for `key` and as the current strategy."""
    _made[key] = made
    _last[:] = [made]
