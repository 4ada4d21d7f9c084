"""Repair: ``EarlyStopping`` and ``ReduceLROnPlateau`` decide on one value for the whole job.

Upstream: no Keras report found (DeepRec-AI/HybridBackend#88 reports the
resulting hang); docs: compat/#monitored-values-that-differ-between-workers.
Keras's compiled metrics are already the job's (their state is
summed over every replica), but a value a callback adds to the logs from a
worker's own data is not: each worker's ``EarlyStopping`` then stops at its
own epoch and restores its own best weights, and each worker's
``ReduceLROnPlateau`` lowers its own learning rate, so the workers'
weights part ways.

The replacements give both callbacks the mean over the workers of the value
they monitor (one all-reduce of two numbers per worker, once an epoch, only
in a multi-worker job); where every worker logged the same value, that value
itself. Every worker then makes the same decision at the same epoch, and the
chief says once that the workers' values differed. A value that some workers
log and others do not cannot be agreed on: every worker raises the same
`ValueError`, naming it, at the same epoch (nobody is left waiting).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from mirrorkit.cluster import chief, workers
from mirrorkit.compat._multi_worker import multi_worker_repair
from mirrorkit.compat.agreed_stop import multi_worker_strategy

_UPSTREAM = "HybridBackend#88; Keras callbacks monitor each worker's own logs"


def agreed_value(callback_name: str, monitor: str, local: Any, table: np.ndarray) -> Any:
    """The value every worker's callback decides on, from every worker's ``(logged, value)``.

    Args:
        callback_name: e.g. ``"EarlyStopping"``, for the message.
        monitor: the monitored key.
        local: this worker's value (None when it did not log it).
        table: one row per worker: 1.0 if it logged `monitor` (else 0.0), and the value.

    Returns:
        `local` where every worker logged the same value (or none did), else the mean.

    Raises:
        ValueError: some workers logged `monitor` and others did not.
    """
    logged = table[:, 0] > 0
    if not logged.any():
        return local
    if not logged.all():
        have = ", ".join(str(i) for i in logged.nonzero()[0])
        lack = ", ".join(str(i) for i in (~logged).nonzero()[0])
        raise ValueError(
            f"{callback_name}(monitor={monitor!r}) cannot make the same decision on every "
            f"worker: worker(s) {have} log {monitor!r} and worker(s) {lack} do not. Log it "
            "on every worker (every worker runs the same callbacks), or monitor one of the "
            "model's compiled metrics, which every worker logs alike."
        )
    values = table[:, 1]
    if np.array_equal(values, np.full_like(values, values[0]), equal_nan=True):
        return local
    mean = float(values.mean())
    chief.say_once(
        f"mean-monitor-{callback_name}-{monitor}",
        f"{callback_name} monitors {monitor!r}, which differs between workers "
        f"({', '.join(f'{v:.6g}' for v in values)}); every worker decides on their mean "
        f"{mean:.6g} (docs: compat/#monitored-values-that-differ-between-workers)",
    )
    return mean


def _shared(callback, local: Any) -> Any:
    strategy = multi_worker_strategy(getattr(callback, "model", None))
    if strategy is None:
        return local
    logged = local is not None
    table = workers.gather(strategy, [1.0 if logged else 0.0, float(local) if logged else 0.0])
    return agreed_value(type(callback).__name__, callback.monitor, local, table)


def _early_stopping(original):
    @functools.wraps(original)
    def get_monitor_value(self, logs):
        return _shared(self, original(self, logs))

    return get_monitor_value


def _reduce_lr(original):
    @functools.wraps(original)
    def on_epoch_end(self, epoch, logs=None):
        logs = {} if logs is None else logs
        local = logs.get(self.monitor)
        shared = _shared(self, local)
        if shared is local:
            return original(self, epoch, logs)
        logs[self.monitor] = shared
        try:
            return original(self, epoch, logs)
        finally:
            logs[self.monitor] = local  # the callbacks after it see this worker's logs

    return on_epoch_end


#: The failure's account on the Keras repairs page (docs: compat/), and the tests of
#: this module's repairs (docs: development/#repairs-and-tests is made from them).
_ACCOUNT = "monitored-values-that-differ-between-workers"
_TESTS = (
    "tests/test_keras_callbacks_multiworker.py::test_keras_callbacks_act_once_and_stop_together_on_two_workers",
    "tests/test_keras_callbacks_multiworker.py::test_monitored_value_is_the_workers_mean_or_their_common_value",
    "tests/test_keras_callbacks_multiworker.py::test_monitored_value_logged_by_some_workers_only_is_an_error",
)

REPAIRS = (
    multi_worker_repair(
        "shared_early_stopping",
        _UPSTREAM,
        "EarlyStopping.get_monitor_value",
        _early_stopping,
        account=_ACCOUNT,
        # its canary: plain Keras's EarlyStopping stops worker 1 alone on its own figure
        tests=(
            *_TESTS,
            "tests/test_keras_callbacks_multiworker.py::"
            "test_plain_keras_callbacks_write_twice_and_hang_on_two_workers",
        ),
        own_canary=True,
    ),
    multi_worker_repair(
        "shared_reduce_lr",
        _UPSTREAM,
        "ReduceLROnPlateau.on_epoch_end",
        _reduce_lr,
        account=_ACCOUNT,
        # its canary: plain Keras's ReduceLROnPlateau halves worker 1's learning rate alone
        tests=(
            *_TESTS,
            "tests/test_keras_callbacks_multiworker.py::"
            "test_plain_keras_callbacks_write_twice_and_hang_on_two_workers",
        ),
        own_canary=True,
    ),
)
