"""Measure how long each training step is blocked waiting for its input batch.

Keras's compiled train step starts with ``iterator.get_next()`` on the
(distributed) dataset iterator. While installed, `InputClock` wraps that
``get_next`` as it is traced into the train function: a ``tf.timestamp()``
before the call (the call's ops wait for it) and one after the batch is
there, so the difference is the time the step was blocked in ``get_next``,
measured inside the compiled step. Waits go to a ring buffer read once an
epoch, never per step. Only the train function is instrumented: the callback
turns recording off while Keras evaluates or predicts.
"""

from __future__ import annotations

import threading

import numpy as np
import tensorflow as tf
from tensorflow.python.data.ops import iterator_ops
from tensorflow.python.distribute import input_lib

from mirrorkit import internals

#: Steps kept between two reads of the ring buffer.
DEFAULT_CAPACITY = 8192

#: The iterator classes whose ``get_next`` Keras's train function calls.
_ITERATORS = (
    (input_lib, "DistributedIterator"),
    (iterator_ops, "OwnedIterator"),
)


class InputClock:
    """Times ``get_next`` in the train function while installed.

    Args:
        capacity: how many steps the ring buffer holds between reads.

    Attributes:
        recording: whether a ``get_next`` traced now is timed; the callback
            sets it for training and clears it for evaluation.
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY):
        self.capacity = capacity
        self.recording = False
        self._saved: list[tuple[type, object]] = []
        self._buffer: tf.Variable | None = None
        self._count: tf.Variable | None = None
        self._read_upto = 0
        self._inside = threading.local()

    @property
    def installed(self) -> bool:
        """Whether ``get_next`` is wrapped now."""
        return bool(self._saved)

    def install(self) -> None:
        """Wraps the iterators' ``get_next`` (undone by `uninstall`)."""
        if self.installed:
            return
        with tf.init_scope():
            self._buffer = tf.Variable(tf.zeros([self.capacity], tf.float64), trainable=False)
            self._count = tf.Variable(tf.constant(0, tf.int64), trainable=False)
        self._read_upto = 0
        for module, name in _ITERATORS:
            cls = internals.require(
                module, name, name=f"tf {name}", used_for="ThroughputCallback's input wait"
            )
            original = internals.require(
                cls, "get_next", name=f"tf {name}.get_next", used_for="the input wait"
            )
            self._saved.append((cls, original))
            cls.get_next = self._timed(original)

    def uninstall(self) -> None:
        """Puts the iterators' own ``get_next`` back."""
        for cls, original in self._saved:
            cls.get_next = original
        self._saved = []

    def _timed(self, original):
        clock = self

        def get_next(iterator, *args, **kwargs):
            outermost = not getattr(clock._inside, "active", False)
            if not (clock.recording and outermost and tf.inside_function()):
                return original(iterator, *args, **kwargs)
            clock._inside.active = True
            try:
                start = tf.timestamp()
                with tf.control_dependencies([start]):
                    batch = original(iterator, *args, **kwargs)
            finally:
                clock._inside.active = False
            arrived = [
                t
                for t in tf.nest.flatten(batch, expand_composites=True)
                if isinstance(t, tf.Tensor)
            ]
            with tf.control_dependencies(arrived):
                wait = tf.timestamp() - start
            slot = tf.math.floormod(clock._count.read_value(), clock.capacity)
            with tf.control_dependencies(
                [
                    clock._buffer.scatter_nd_update([[slot]], [wait]),
                    clock._count.assign_add(1),
                ]
            ):
                return tf.nest.map_structure(tf.identity, batch, expand_composites=True)

        get_next.__wrapped__ = original
        return get_next

    def read_new(self) -> np.ndarray:
        """Seconds each train step waited in ``get_next``, for steps since the last read."""
        if self._count is None:
            return np.zeros(0)
        count = int(self._count.numpy())
        buffer = self._buffer.numpy()
        first = max(self._read_upto, count - self.capacity)
        self._read_upto = count
        return np.array([buffer[i % self.capacity] for i in range(first, count)])


def wait_share(waits: np.ndarray, step_times: np.ndarray) -> float | None:
    """The share of step time spent waiting for input, over the measured steps.

    Args:
        waits: seconds each step of the epoch waited in ``get_next``.
        step_times: the epoch's measured (post-warm-up) step times; the waits
            of the last ``len(step_times)`` steps are used.

    Returns:
        Total wait over total step time, or None when fewer waits than step
        times were recorded.
    """
    if not len(step_times) or waits.size < len(step_times):
        return None
    total = float(np.sum(step_times))
    return float(np.sum(waits[-len(step_times) :])) / total if total > 0 else None
