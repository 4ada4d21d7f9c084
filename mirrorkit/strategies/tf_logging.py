"""Keep TensorFlow's Python INFO log quiet in notebooks unless the user asked for it.

In an interactive session (Jupyter, IPython, ``python -i``) TensorFlow's
`tf.get_logger()` sets the ``tensorflow`` logger to INFO on its own and writes
to stdout, so every distributed ``fit`` interleaves lines such as
``INFO:tensorflow:Reduce to /job:localhost/replica:0/task:0/device:CPU:0 then
broadcast to (...)`` with the progress bar. `quiet_interactive_info` puts that
logger back to WARNING the first time `mk.strategy()` makes a strategy, only
when the level is the one TensorFlow chose itself, and says so once.

A level the user set is kept: any level other than INFO, INFO set after the
first `mk.strategy()`, or INFO in a non-interactive process (where TensorFlow
never sets it). One case cannot be told apart from TensorFlow's own choice:
``tf.get_logger().setLevel("INFO")`` in a notebook before the first
`mk.strategy()`; the message says how to bring INFO back.
"""

from __future__ import annotations

import logging
import sys

from mirrorkit.cluster import chief

_checked = False


def quiet_interactive_info() -> bool:
    """Sets TensorFlow's logger from its interactive INFO default to WARNING, once.

    Returns:
        Whether the level was changed (at most once per process).

    Example:
    ```python
    from mirrorkit.strategies import tf_logging

    tf_logging.quiet_interactive_info()  # called by mk.strategy(); a no-op in scripts
    ```
    """
    global _checked
    if _checked:
        return False
    _checked = True
    import tensorflow as tf

    logger = tf.get_logger()  # makes TensorFlow choose its default now, if it has not yet
    if not (_interactive() and logger.level == logging.INFO and _has_tf_handler(logger)):
        return False
    logger.setLevel(logging.WARNING)
    chief.say(
        "TensorFlow's INFO log is kept at WARNING in this interactive session; "
        'tf.get_logger().setLevel("INFO") brings it back'
    )
    return True


def _interactive() -> bool:
    """TensorFlow's own test for an interactive session (`tf.get_logger`)."""
    return bool(getattr(sys, "ps1", None)) or bool(sys.flags.interactive)


def _has_tf_handler(logger: logging.Logger) -> bool:
    """Whether the handler TensorFlow adds when it sets INFO itself is there."""
    return any(
        type(h) is logging.StreamHandler
        and h.formatter is not None
        and h.formatter._fmt == logging.BASIC_FORMAT
        for h in logger.handlers
    )
