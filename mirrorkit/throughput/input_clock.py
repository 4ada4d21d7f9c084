"""Measure how long each training step is blocked waiting for its own input batch.

Keras's compiled train step starts with ``iterator.get_next()`` on the
(distributed) dataset iterator. While installed, `InputClock` wraps that
``get_next`` as it is traced into the train function: a ``tf.timestamp()``
before the call (the call's ops wait for it) and one when this worker's
batch is there, so the difference is the time the step was blocked waiting
for its input, measured inside the compiled step.

"This worker's batch is there" is not the end of ``get_next``: for a finite
dataset in a multi-worker job, TensorFlow's ``DistributedIterator.get_next``
first takes this worker's next element (as an optional, from its own
per-worker iterator) and then agrees with the other workers whether any of
them has one (an all-reduce of the has-value counts) before it returns. A
fast worker waits in that agreement for a slower peer, which is the peer's
delay, not this worker's input. So the clock ends at the per-worker
iterators' output (``_SingleWorkerDatasetIteratorBase.get_next_as_list`` /
``get_next_as_optional_list``, traced in the same graph), never at the
agreement. A plain ``tf.data`` iterator has no agreement; its whole
``get_next`` is timed.

Keras 3.16 takes the batch before the compiled step, eagerly
(``iterator.get_next_as_optional()`` in Python, then the step on its value):
there the clock times that call with the host's clock, again up to this
worker's own element.

Waits go to a ring buffer read once an epoch, never per step (eager waits to
a list). Only the train function is instrumented: the callback turns
recording off while Keras evaluates or predicts.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import tensorflow as tf

from mirrorkit import internals
from mirrorkit.cluster.workers import every_strategy
from mirrorkit.patching.repair import SCOPED_WHILE, Repair, apply_scoped, remove_scoped

#: Steps kept between two reads of the ring buffer.
DEFAULT_CAPACITY = 8192

_INPUT_LIB = "tensorflow.python.distribute.input_lib"
#: The iterator classes (module, class) whose ``get_next`` Keras's train function calls.
_ITERATORS = (
    (_INPUT_LIB, "DistributedIterator"),
    ("tensorflow.python.data.ops.iterator_ops", "OwnedIterator"),
)
#: A distributed iterator's per-worker iterator class, and its methods that take this
#: worker's next element before the workers agree whether there is one.
_PER_WORKER = (_INPUT_LIB, "_SingleWorkerDatasetIteratorBase")
_PRODUCERS = ("get_next_as_list", "get_next_as_optional_list")


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
        self._saved: list[Repair] = []
        self._buffer: tf.Variable | None = None
        self._count: tf.Variable | None = None
        self._read_upto = 0
        self._eager_waits: list[float] = []
        self._inside = threading.local()

    @property
    def installed(self) -> bool:
        """Whether ``get_next`` is wrapped now."""
        return bool(self._saved)

    def install(self) -> None:
        """Wraps the iterators' ``get_next`` and per-worker element methods (see `uninstall`).

        Raises:
            InternalChangedError: a TensorFlow internal the clock wraps is missing.
        """
        if self.installed:
            return
        with tf.init_scope():
            self._buffer = tf.Variable(tf.zeros([self.capacity], tf.float64), trainable=False)
            self._count = tf.Variable(tf.constant(0, tf.int64), trainable=False)
        self._read_upto = 0
        # Every internal is looked up before any is wrapped: a missing one changes nothing.
        targets = []
        for module, name in _ITERATORS:
            cls = internals.load(module, name, used_for="ThroughputCallback's input wait")
            internals.require(
                cls, "get_next", name=f"tf {name}.get_next", used_for="the input wait"
            )
            targets.append((cls, "get_next", self._timed))
            if hasattr(cls, "get_next_as_optional"):  # Keras 3.16 calls it eagerly
                targets.append((cls, "get_next_as_optional", self._timed_eager))
        module, name = _PER_WORKER
        cls = internals.load(module, name, used_for="ThroughputCallback's input wait")
        for method in _PRODUCERS:
            internals.require(
                cls,
                method,
                name=f"tf {name}.{method}",
                used_for="ThroughputCallback's input wait without the other workers' wait",
            )
            targets.append((cls, method, self._produced))
        for cls, method, wrap in targets:  # each a scoped repair, listed meanwhile
            repair = Repair(
                name=f"input_clock.{cls.__name__}.{method}",
                upstream="ThroughputCallback's input wait (while it is installed)",
                module=cls.__module__,
                target=f"{cls.__name__}.{method}",
                replacement=wrap,  # around what is below it: TensorFlow's, or another clock's
                applies_to=every_strategy,
                when=SCOPED_WHILE,
            )
            apply_scoped(repair)
            self._saved.append(repair)

    def uninstall(self) -> None:
        """Puts TensorFlow's own methods back."""
        for repair in reversed(self._saved):
            remove_scoped(repair)
        self._saved = []

    def _produced(self, original):
        """Wraps a per-worker iterator method: notes the tensors of this worker's element."""
        clock = self

        def produce(iterator, *args, **kwargs):
            result = original(iterator, *args, **kwargs)
            eager = getattr(clock._inside, "eager_produced", None)
            if eager is not None and not tf.inside_function():
                eager.append(time.perf_counter())  # this worker's element is here
            collecting = getattr(clock._inside, "produced", None)
            # Only the calls traced in get_next's own graph: the one in the end-of-data branch
            # (a cond branch graph) never runs in a step that has a batch.
            if collecting is not None and tf.compat.v1.get_default_graph() is collecting[0]:
                collecting[1].extend(_tensors(result))
            return result

        produce.__wrapped__ = original
        return produce

    def _timed(self, original):
        clock = self

        def get_next(iterator, *args, **kwargs):
            outermost = not getattr(clock._inside, "active", False)
            if not (clock.recording and outermost and tf.inside_function()):
                return original(iterator, *args, **kwargs)
            clock._inside.active = True
            produced: list[tf.Tensor] = []
            clock._inside.produced = (tf.compat.v1.get_default_graph(), produced)
            try:
                start = tf.timestamp()
                with tf.control_dependencies([start]):
                    batch = original(iterator, *args, **kwargs)
            finally:
                clock._inside.active = False
                clock._inside.produced = None
            # This worker's own element (before any agreement with the other workers), or,
            # for an iterator without per-worker iterators, the batch get_next returned.
            arrived = produced or _tensors(batch)
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

    def _timed_eager(self, original):
        """Wraps ``get_next_as_optional`` where Keras calls it outside the compiled step."""
        clock = self

        def get_next_as_optional(iterator, *args, **kwargs):
            outermost = not getattr(clock._inside, "active", False)
            if not (clock.recording and outermost) or tf.inside_function():
                return original(iterator, *args, **kwargs)
            clock._inside.active = True
            clock._inside.eager_produced = arrived = []
            start = time.perf_counter()
            try:
                result = original(iterator, *args, **kwargs)
            finally:
                clock._inside.active = False
                clock._inside.eager_produced = None
            # This worker's own element (before the workers agree whether any has one).
            clock._eager_waits.append((arrived[-1] if arrived else time.perf_counter()) - start)
            return result

        get_next_as_optional.__wrapped__ = original
        return get_next_as_optional

    def read_new(self) -> np.ndarray:
        """Seconds each train step waited for its own input, for steps since the last read."""
        eager, self._eager_waits = self._eager_waits, []
        if self._count is None:
            return np.array(eager)
        count = int(self._count.numpy())
        buffer = self._buffer.numpy()
        first = max(self._read_upto, count - self.capacity)
        self._read_upto = count
        return np.array([buffer[i % self.capacity] for i in range(first, count)] + eager)


def _tensors(value) -> list[tf.Tensor]:
    """The graph tensors in `value` (optionals and other composites expanded)."""
    return [t for t in tf.nest.flatten(value, expand_composites=True) if isinstance(t, tf.Tensor)]


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
