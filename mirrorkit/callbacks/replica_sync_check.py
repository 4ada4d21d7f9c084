"""`ReplicaSyncCheck`: every replica of every worker must hold the same variables.

Synchronous data parallelism rests on one invariant: after every step, each
replica's copy of each mirrored variable is the same. A custom training step
that writes one replica's copy, a non-deterministic op applied per replica, or
a worker restored from another checkpoint breaks it silently: training goes
on, each replica drifting. The check computes two float64 checksums of each
variable on every replica (its sum, and a position-weighted sum that also
catches permuted values), gathers the table from every replica of every worker
in one all-reduce, and compares it with replica 0's row.
"""

from __future__ import annotations

import statistics
import time

import keras
import numpy as np
import tensorflow as tf

from mirrorkit.cluster import chief, workers


class ReplicasDivergedError(RuntimeError):
    """Replicas hold different values of a variable that should be mirrored.

    Attributes:
        variable: the path (name) of the first variable that differs.
        replica: the global replica id whose copy differs from replica 0's.
        difference: the largest difference between that copy's checksum and replica 0's.
    """

    def __init__(self, message: str, *, variable: str, replica: int, difference: float):
        super().__init__(message)
        self.variable = variable
        self.replica = replica
        self.difference = difference


class ReplicaSyncCheck(keras.callbacks.Callback):
    """Checks every N steps that all replicas of all workers hold the same variables.

    Every worker runs the check at the same step (it is one collective), and
    every worker raises the same `ReplicasDivergedError`, naming the first
    variable (model weights first, then the optimizer's) whose copy on some
    replica differs from replica 0's, the replica and worker, and by how much.

    The cost of each check (wall time, including its all-reduce) is measured:
    ``costs_s`` holds every check's seconds (the first also traces the check,
    once per ``fit``), and at the end of training the chief says the count and
    the median.

    Args:
        every_n_steps: check after every this many training steps (from the
            first); also at the end of training.
        atol: the largest checksum difference accepted. The default 0.0
            demands bitwise-equal copies, which synchronous training gives.

    Example:
    ```python
    import keras
    import numpy as np
    import mirrorkit as mk

    strategy = mk.strategy(cpu_replicas=2)

    def make_model():  # compiled inside the strategy's scope, by mk.build
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        return model

    model = mk.build(make_model, strategy)
    data = mk.distribute((np.ones((64, 4)), np.ones((64, 1))), strategy, global_batch_size=32)
    check = mk.callbacks.ReplicaSyncCheck(every_n_steps=100)
    model.fit(data, callbacks=[check])
    print(check.costs_s)  # seconds per check
    ```
    """

    def __init__(self, every_n_steps: int = 100, atol: float = 0.0):
        super().__init__()
        if (
            isinstance(every_n_steps, bool)
            or not isinstance(every_n_steps, int)
            or every_n_steps < 1
        ):
            raise ValueError(
                f"ReplicaSyncCheck(every_n_steps=...) takes a whole number of steps >= 1; "
                f"got {every_n_steps!r}"
            )
        if not atol >= 0:
            raise ValueError(f"ReplicaSyncCheck(atol=...) must be >= 0; got {atol!r}")
        self.every_n_steps = every_n_steps
        self.atol = float(atol)
        self.costs_s: list[float] = []
        self._steps = 0
        self._checksums = None

    def on_train_begin(self, logs=None):
        """Starts counting steps."""
        self._steps = 0
        self._checksums = None

    def on_train_batch_end(self, batch, logs=None):
        """Checks after every `every_n_steps`-th step."""
        self._steps += 1
        if self._steps % self.every_n_steps == 0:
            self.check()

    def on_train_end(self, logs=None):
        """Checks once more, unless the last step was checked; says the cost."""
        if self._steps % self.every_n_steps:
            self.check()
        if self.costs_s:
            chief.say(
                f"ReplicaSyncCheck: {len(self.costs_s)} check(s), median "
                f"{statistics.median(self.costs_s) * 1e3:.2f} ms each"
            )

    def check(self) -> None:
        """Runs the check now (on every worker at the same point), raising if replicas differ."""
        start = time.perf_counter()
        names, table = self._table()
        self.costs_s.append(time.perf_counter() - start)
        reference = table[0]
        for column, name in enumerate(names):
            diffs = np.abs(table[:, column, :] - reference[column]).max(axis=1)
            over = np.flatnonzero(diffs > self.atol)
            if over.size:
                self._raise(name, table, column, int(over[0]), float(diffs[over[0]]))

    def _raise(self, name, table, column, replica, difference):
        strategy = self.model.distribute_strategy
        per_worker = max(1, strategy.num_replicas_in_sync // workers.num_workers(strategy))
        raise ReplicasDivergedError(
            f"ReplicaSyncCheck after step {self._steps}: variable {name!r} differs between "
            f"replicas: worker {replica // per_worker} replica {replica % per_worker} (global "
            f"replica {replica}) has checksum sum={float(table[replica, column, 0])!r} "
            f"(weighted {float(table[replica, column, 1])!r}), replica 0 has "
            f"sum={float(table[0, column, 0])!r} (weighted {float(table[0, column, 1])!r}): "
            f"off by {difference:.6g} (atol={self.atol}). Something wrote one replica's copy "
            "(a custom train_step assigning per replica, a worker restored from another "
            "checkpoint, or non-deterministic per-replica updates).",
            variable=name,
            replica=replica,
            difference=difference,
        )

    def _table(self) -> tuple[list[str], np.ndarray]:
        if self._checksums is None:
            self._checksums = self._make_checksums()
        names, fn = self._checksums
        return names, fn().numpy()

    def _make_checksums(self):
        model = self.model
        strategy = model.distribute_strategy
        variables = _mirrored_variables(model)
        names = [v.path if hasattr(v, "path") else v.name for v in variables]
        tf_variables = [v.value if isinstance(v, keras.Variable) else v for v in variables]
        replicas = strategy.num_replicas_in_sync

        def per_replica():
            context = tf.distribute.get_replica_context()
            rows = tf.stack([_checksum(v) for v in tf_variables])  # (variables, 2)
            mine = tf.one_hot(
                tf.cast(context.replica_id_in_sync_group, tf.int32), replicas, dtype=tf.float64
            )
            table = mine[:, None, None] * rows[None]  # (replicas, variables, 2)
            return context.all_reduce(tf.distribute.ReduceOp.SUM, table)

        @tf.function
        def checksums():
            result = strategy.run(per_replica)
            return strategy.experimental_local_results(result)[0]

        return names, checksums


def _mirrored_variables(model: keras.Model) -> list:
    """Model weights, then optimizer variables; not metrics (those differ per replica by design)."""
    found, seen = [], set()
    optimizer = getattr(model, "optimizer", None)
    candidates = list(model.weights) + (list(optimizer.variables) if optimizer is not None else [])
    for variable in candidates:
        tf_var = variable.value if isinstance(variable, keras.Variable) else variable
        if id(tf_var) in seen:
            continue
        seen.add(id(tf_var))
        if getattr(tf_var, "synchronization", None) == tf.VariableSynchronization.ON_READ:
            continue
        if not (tf_var.dtype.is_floating or tf_var.dtype.is_integer):
            continue
        found.append(variable)
    return found


def _checksum(variable) -> tf.Tensor:
    """Sum and position-weighted sum of the replica's own copy, in float64."""
    values = tf.reshape(tf.cast(tf.convert_to_tensor(variable), tf.float64), [-1])
    size = tf.cast(tf.size(values), tf.float64)
    weights = 1.0 + tf.range(size, dtype=tf.float64) / tf.maximum(size, 1.0)
    return tf.stack([tf.reduce_sum(values), tf.reduce_sum(values * weights)])
