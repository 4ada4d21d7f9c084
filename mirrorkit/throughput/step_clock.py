"""Time each replica's own work in a training step, inside the compiled step.

In synchronous training every replica's step takes the same wall time: a fast
replica waits in the gradient all-reduce for the slowest. What tells a slow
replica (or worker) apart is the time from the start of its step to the moment
its gradients are ready for the all-reduce. `StepClock` records, with
``tf.timestamp()`` in each replica's traced step, four moments a step (its start,
its gradients ready, the all-reduce's end, the step's end), from which a read
makes three intervals:

- ``compute``: step start to gradients ready (the forward and backward pass).
  The start is the earliest of this worker's replicas' start stamps: nothing
  waits for a stamp, so the executor may take one late, once the replica's
  work has begun, and the replicas' batches arrive together;
- ``all_reduce``: gradients ready to the all-reduce's end (the transfer, and
  a faster replica's wait for the slowest);
- ``update``: the all-reduce's end to the end of ``train_step`` (the
  optimizer's update and the metrics).

They are kept in a ring buffer of per-replica variables (float64 seconds) that
are read once per report, never per step.

The marks are hooks of `mirrorkit.training.gradient_hooks`: ``"step_clock"``
(stage ``"before"``, first: on each replica's own gradients, before NaNGuard's
check and before the all-reduce, compressed or not) and
``"step_clock.reduced"`` (stage ``"after"``, first), and the step hook
``"step_clock"`` around ``train_step``.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from mirrorkit import internals
from mirrorkit.training import gradient_hooks, step_hooks

#: Steps kept between two reads of the ring buffer (an epoch's last ones, when it has more).
DEFAULT_CAPACITY = 512

#: The intervals a read gives for each step.
INTERVALS = ("compute", "all_reduce", "update")
#: The moments stamped each step, in the buffer's column order.
MOMENTS = ("start", "ready", "reduced", "end")


@dataclasses.dataclass
class ReplicaTimes:
    """Seconds of each interval, per local replica and step (arrays of shape (replicas, steps)).

    Attributes:
        compute: step start to gradients ready.
        all_reduce: gradients ready to the all-reduce's end.
        update: the all-reduce's end to the end of the step.
    """

    compute: np.ndarray
    all_reduce: np.ndarray
    update: np.ndarray

    @property
    def steps(self) -> int:
        """How many steps were read."""
        return int(self.compute.shape[1]) if self.compute.ndim == 2 else 0


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
        print([hook.name for hook in gradient_hooks.hooks(model.optimizer)])
        # ['step_clock', 'step_clock.reduced']
        model.fit(keras.random.normal((64, 4)), keras.random.normal((64, 1)), verbose=0)
        print(clock.read_new().compute)  # seconds of own work per step, a row per replica
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
                tf.zeros([self.capacity, len(MOMENTS)], tf.float64),
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
        # Per replica (its tracing thread): the step's start, then its gradients' ready time.
        marks: dict[int, dict[str, tf.Tensor]] = {}

        def timed_train_step(call_next, data, *args, **kwargs):
            # Taken once this replica's batch is there; nothing waits for it. (A plain
            # tf.timestamp gating the step cost 17% of a 5 ms step: automatic control
            # dependencies chain every input-less stateful op after the one before; making
            # the step read its batch after this stamp cost 1.4% to 2.7%.) A stamp taken
            # late is why a read measures from the earliest replica's start.
            arrived = [t for t in tf.nest.flatten(data) if isinstance(t, tf.Tensor)]
            start = _stamp_after(self._count.handle, arrived)
            mine = marks[threading.get_ident()] = {"start": start}
            logs = call_next(data, *args, **kwargs)
            if "reduced" not in mine:  # no all-reduce ran in this step (one replica, a skip)
                marks.pop(threading.get_ident(), None)
                return logs
            # After the update: each weight is read after the optimizer's assignment to it
            # (automatic control dependencies order a variable's accesses as written).
            done = [tf.convert_to_tensor(v) for v in self._model.trainable_variables]
            done += [t for t in tf.nest.flatten(logs) if isinstance(t, tf.Tensor)]
            end = _stamp_after(self._count.handle, done)
            times = tf.stack([start, mine["ready"], mine["reduced"], end])
            marks.pop(threading.get_ident(), None)
            slot = tf.math.floormod(tf.convert_to_tensor(self._count), self.capacity)
            # A variable synchronized on read takes no scatter in a replica context: the
            # replica's own copy, updated in one row and assigned back.
            updated = tf.tensor_scatter_nd_update(
                tf.convert_to_tensor(self._buffer), [[slot]], [times]
            )
            # Nothing waits for these writes (the function runs every stateful op before it
            # returns).
            self._buffer.assign(updated)
            self._count.assign_add(1)
            return logs

        def gradients_ready(step: gradient_hooks.Gradients) -> None:
            mine = marks.get(threading.get_ident())
            if mine is not None and tf.distribute.in_cross_replica_context() is False:
                ready = [_dense(g) for g, _ in step.grads_and_vars if g is not None]
                # taken once every gradient is there; the all-reduce does not wait for it
                mine["ready"] = _stamp_after(self._count.handle, ready)

        def gradients_reduced(step: gradient_hooks.Gradients) -> None:
            mine = marks.get(threading.get_ident())
            if mine is not None and "ready" in mine:
                reduced = [_dense(g) for g, _ in step.grads_and_vars if g is not None]
                mine["reduced"] = _stamp_after(self._count.handle, reduced)  # nor the update

        self._hooks = (
            gradient_hooks.GradientHook("step_clock", gradients_ready),
            gradient_hooks.GradientHook("step_clock.reduced", gradients_reduced),
        )
        for hook in self._hooks:
            gradient_hooks.register(optimizer, hook, used_for=used_for)
        self._step_hook = step_hooks.StepHook("step_clock", timed_train_step)
        step_hooks.register(model, self._step_hook)  # traced again with the clock in place
        self._model, self._optimizer = model, optimizer
        return True

    def uninstall(self) -> None:
        """Restores the model's own train step and optimizer method."""
        if self._model is None:
            return
        step_hooks.remove(self._model, self._step_hook)  # traced again without it next fit
        for hook in self._hooks:
            gradient_hooks.remove(self._optimizer, hook)
        self._model = self._optimizer = None

    def read_new(self) -> ReplicaTimes:
        """Every local replica's intervals for the steps since the last read (one read a call).

        Returns:
            A `ReplicaTimes` with one row per local replica, in replica order.
        """
        if self._model is None:
            return ReplicaTimes(*(np.zeros((0, 0)) for _ in INTERVALS))
        strategy = self._model.distribute_strategy
        counts = [int(c.numpy()) for c in strategy.experimental_local_results(self._count)]
        buffers = [b.numpy() for b in strategy.experimental_local_results(self._buffer)]
        count = min(counts)  # every replica records every step
        first = max(self._read_upto, count - self.capacity)
        self._read_upto = count
        rows = np.array([[b[i % self.capacity] for i in range(first, count)] for b in buffers])
        start, ready, reduced, end = np.moveaxis(
            rows.reshape(len(buffers), count - first, len(MOMENTS)), 2, 0
        )
        return ReplicaTimes(
            compute=ready - start.min(axis=0, keepdims=True),  # the earliest replica's start
            all_reduce=np.maximum(reduced - ready, 0.0),
            update=np.maximum(end - reduced, 0.0),
        )


@tf.function(autograph=False)
def _stamp_after(handle, after):
    """The time once `after` are computed.

    A call with a variable's resource (`handle`) among its inputs: automatic control
    dependencies order it with that variable's other accesses only, not in the chain into
    which they put every input-less stateful op (a plain ``tf.timestamp`` there held back
    the step's other such ops).
    """
    del handle
    with tf.control_dependencies(after):
        return tf.timestamp()


def _dense(value):
    return value.values if isinstance(value, tf.IndexedSlices) else value
