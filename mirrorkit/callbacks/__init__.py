"""Keras callbacks that act on every worker of a job together.

- `NaNGuard`: a non-finite loss or gradient on any replica of any worker stops
  every worker at the same step, naming the step, the worker and the replica.
- `ReplicaSyncCheck`: every N steps, checks that every replica of every worker
  holds the same variables, naming the first one that differs.
- `HangWatchdog`: a training step that never completes ends the worker, naming
  the step and dumping its Python stacks (docs:
  failures/#a-training-step-never-completes-deadlocked-input-pipeline-user-code-that-never-returns).

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
model.fit(data, callbacks=[mk.callbacks.NaNGuard(), mk.callbacks.ReplicaSyncCheck(100)])
```
"""

from mirrorkit.callbacks.hang_watchdog import HangWatchdog
from mirrorkit.callbacks.nan_guard import NaNGuard, NonFiniteError
from mirrorkit.callbacks.replica_sync_check import ReplicasDivergedError, ReplicaSyncCheck

__all__ = [
    "HangWatchdog",
    "NaNGuard",
    "NonFiniteError",
    "ReplicaSyncCheck",
    "ReplicasDivergedError",
]
