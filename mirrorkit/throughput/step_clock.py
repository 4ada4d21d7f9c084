"""Time each replica's own work in a training step, inside the compiled step.

In synchronous training every worker's step takes the same wall time: a fast
worker waits in the gradient all-reduce for the slowest. What tells a slow
worker apart is the time from the start of its step to the moment its
gradients are ready for the all-reduce. `StepClock` records that with
``tf.timestamp()`` in the traced step and keeps it in a ring buffer of
per-replica variables that are read once per report, never per step.

The mark when the gradients are ready is the hook ``"step_clock"`` of
`mirrorkit.training.gradient_hooks` (stage ``"before"``, first): it runs on
each replica's own gradients before NaNGuard's check and before the
all-reduce, whether compressed or not.
"""

from __future__ import annotations

import threading
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from mirrorkit import internals
from mirrorkit.training import gradient_hooks, step_hooks

#: Steps kept between two reads of the ring buffer.
DEFAULT_CAPACITY = 8192


class StepClock:
    """Instruments a Keras model's train step and optimizer; reads the times back.

    Args:
        capacity: how many steps the ring buffer holds between reads.
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY):
        self.capacity = capacity
        self._model: keras.Model | None = None
        self._optimizer: Any = None
        self._buffer: tf.Variable | None = None
        self._count: tf.Variable | None = None
        self._read_upto = 0

    @property
    def installed(self) -> bool:
        """Whether the model is instrumented now."""
        return self._model is not None

    def install(self, model: keras.Model) -> bool:
        """Instruments `model`; returns False when its optimizer has no gradient all-reduce.

        Args:
            model: a compiled model.

        Returns:
            Whether the clock is in place (False, with a warning, when the
            optimizer's all-reduce internal is missing).

        Example:
        ```python
        import keras
        import mirrorkit as mk
        from mirrorkit.throughput.step_clock import StepClock
        from mirrorkit.training import gradient_hooks, step_hooks

        def make_model():
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
            model.compile(optimizer="sgd", loss="mse")
            return model

        model = mk.build(make_model, mk.strategy(cpu_replicas=2))
        clock = StepClock()
        clock.install(model)
        print([hook.name for hook in gradient_hooks.hooks(model.optimizer)])  # ['step_clock']
        model.fit(keras.random.normal((64, 4)), keras.random.normal((64, 1)), verbose=0)
        print(clock.read_new())  # seconds of own work per step, first replica
        clock.uninstall()
        ```
        """
        optimizer = gradient_hooks.innermost_optimizer(model)
        if optimizer is None:
            return False
        used_for = "ThroughputCallback's per-worker compute clock and straggler flag"
        try:
            gradient_hooks.require(optimizer, used_for=used_for)
        except internals.InternalChangedError:
            internals.warn(gradient_hooks.NAME, used_for)
            return False
        strategy = model.distribute_strategy
        with strategy.scope():
            self._buffer = tf.Variable(
                tf.zeros([self.capacity], tf.float64),
                trainable=False,
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.SUM,
            )
            self._count = tf.Variable(
                tf.constant(0, tf.int64),
                trainable=False,
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.SUM,
            )
        self._read_upto = 0
        starts: dict[int, tf.Tensor] = {}

        def timed_train_step(call_next, data, *args, **kwargs):
            start = tf.timestamp()
            starts[threading.get_ident()] = start
            with tf.control_dependencies([start]):
                data = tf.nest.map_structure(_after, data)
            return call_next(data, *args, **kwargs)

        def gradients_ready(step: gradient_hooks.Gradients) -> None:
            start = starts.pop(threading.get_ident(), None)
            if start is not None and tf.distribute.in_cross_replica_context() is False:
                ready = [_dense(g) for g, _ in step.grads_and_vars if g is not None]
                with tf.control_dependencies(ready):
                    elapsed = tf.timestamp() - start
                slot = tf.math.floormod(tf.convert_to_tensor(self._count), self.capacity)
                updated = tf.tensor_scatter_nd_update(
                    tf.convert_to_tensor(self._buffer), [[slot]], [elapsed]
                )
                with tf.control_dependencies(
                    [self._buffer.assign(updated), self._count.assign_add(1)]
                ):
                    step.grads_and_vars = [(_after(g), v) for g, v in step.grads_and_vars]

        self._hook = gradient_hooks.GradientHook("step_clock", gradients_ready)
        gradient_hooks.register(optimizer, self._hook, used_for=used_for)
        self._step_hook = step_hooks.StepHook("step_clock", timed_train_step)
        step_hooks.register(model, self._step_hook)  # traced again with the clock in place
        self._model, self._optimizer = model, optimizer
        return True

    def uninstall(self) -> None:
        """Restores the model's own train step and optimizer method."""
        if self._model is None:
            return
        step_hooks.remove(self._model, self._step_hook)  # traced again without it next fit
        gradient_hooks.remove(self._optimizer, self._hook)
        self._model = self._optimizer = None

    def read_new(self) -> np.ndarray:
        """Seconds of own work of this worker's first replica, for steps since the last read."""
        if self._model is None:
            return np.zeros(0)
        strategy = self._model.distribute_strategy
        count = int(strategy.experimental_local_results(self._count)[0].numpy())
        buffer = strategy.experimental_local_results(self._buffer)[0].numpy()
        first = max(self._read_upto, count - self.capacity)
        self._read_upto = count
        return np.array([buffer[i % self.capacity] for i in range(first, count)])


def _dense(value):
    return value.values if isinstance(value, tf.IndexedSlices) else value


def _after(value):
    if isinstance(value, tf.Tensor):
        return tf.identity(value)
    if isinstance(value, tf.IndexedSlices):
        return tf.IndexedSlices(tf.identity(value.values), value.indices, value.dense_shape)
    return value
