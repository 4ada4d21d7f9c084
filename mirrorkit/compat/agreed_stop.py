"""Repair: every worker of a job stops training at the same step.

Upstream: no Keras report found; the same hang is reported for other
frameworks' early stopping (DeepRec-AI/HybridBackend#88, tensorflow/estimator#49
added a multi-worker early-stopping hook to Estimator); docs: compat/#stopping-on-one-worker-only.
Keras's ``fit`` leaves its loop when
``model.stop_training`` is set, checked after each ``on_train_batch_end`` and
each ``on_epoch_end``. A callback that sets it from a value that differs
between workers (``TerminateOnNaN`` on ``step_logs="local"`` losses, a user
callback reading a worker's own figure, ``EarlyStopping`` on a per-worker
metric) stops one worker while the others start the next step and wait for it
in that step's all-reduce: the job hangs.

The replacements make the flag a decision of the job: after the callbacks of
``CallbackList.on_epoch_end`` have run, every worker learns whether any worker
set it (one all-reduce of one number per worker, once an epoch) and all of
them stop when one did, said once. The same happens after each
``on_train_batch_end`` only when some worker has a callback that could set the
flag there (one that overrides a batch hook and is not one of Keras's logging
or saving callbacks, ``TerminateOnNaN`` on the default averaged step logs, or
mirrorkit's own); which is agreed once, in ``on_train_begin``, so that every
worker runs the same collectives.
"""

from __future__ import annotations

import functools

import keras
import numpy as np
import tensorflow as tf

from mirrorkit.cluster import chief, workers
from mirrorkit.compat._multi_worker import multi_worker_repair
from mirrorkit.compat.multi_worker_reduce import LOCAL_STEP_LOGS
from mirrorkit.compat.multi_worker_reduce import REPAIR as STEP_LOGS_REPAIR
from mirrorkit.patching import attached

_UPSTREAM = "HybridBackend#88, estimator#49; Keras has no multi-worker stop"
_COMPILED = "agreed_stop.flag_table"  # kept for a strategy: the compiled all-reduce
_BATCH_AGREEMENT = "agreed_stop.batch_agreement"  # kept for a CallbackList: agree each batch
_BATCH_HOOKS = ("on_batch_begin", "on_batch_end", "on_train_batch_begin", "on_train_batch_end")
_NEVER_STOP = (
    "BackupAndRestore",
    "CSVLogger",
    "History",
    "LearningRateScheduler",
    "ModelCheckpoint",
    "ProgbarLogger",
    "RemoteMonitor",
    "TensorBoard",
)


def multi_worker_strategy(model):
    """`model`'s strategy if it spans several workers, else None."""
    strategy = getattr(model, "distribute_strategy", None)
    if strategy is None or not workers.is_multi_worker(strategy):
        return None
    return strategy if workers.num_workers(strategy) > 1 else None


def may_stop_mid_epoch(
    callback: keras.callbacks.Callback, averaged_step_logs: bool = False
) -> bool:
    """Whether `callback` could set ``model.stop_training`` in a batch hook on one worker only.

    Args:
        callback: a Keras callback.
        averaged_step_logs: whether the per-step logs are averaged over every
            worker (the default of `mk.build`), so that ``TerminateOnNaN``,
            which reads the step's loss, decides alike on every worker.

    Returns:
        False for Keras's logging and saving callbacks (exactly those classes),
        ``TerminateOnNaN`` on averaged step logs, mirrorkit's own callbacks
        (they keep the workers in step themselves) and callbacks that leave
        every batch hook as `keras.callbacks.Callback` has it; True otherwise.
    """
    cls = type(callback)
    if cls.__module__.split(".")[0] == "mirrorkit":
        return False
    never = _NEVER_STOP + (("TerminateOnNaN",) if averaged_step_logs else ())
    if any(cls is getattr(keras.callbacks, name, None) for name in never):
        return False
    base = keras.callbacks.Callback
    return any(
        name in vars(callback) or getattr(cls, name, None) is not getattr(base, name)
        for name in _BATCH_HOOKS
    )


def flag_table(strategy, flag: bool) -> np.ndarray:
    """Every worker's `flag`, entry i from worker i, by one all-reduce in a compiled function.

    Every worker must call it at the same point (it is a collective). The
    function is traced once per strategy: called each step, it costs a
    fraction of what an eager `mirrorkit.cluster.workers.gather` does.

    Args:
        strategy: a multi-worker strategy.
        flag: this worker's flag.

    Returns:
        A float32 array of one entry per worker, 1.0 where that worker's flag is set.
    """
    compiled = attached.attached(strategy, _COMPILED)
    if compiled is None:
        here = workers.position(strategy)
        first_local = here.worker_index * (strategy.num_replicas_in_sync // here.num_workers)
        mine = tf.one_hot(here.worker_index, here.num_workers, dtype=tf.float32)

        def replica_fn(value):
            context = tf.distribute.get_replica_context()
            first = tf.equal(context.replica_id_in_sync_group, first_local)
            return context.all_reduce("SUM", tf.where(first, mine * value, tf.zeros_like(mine)))

        @tf.function
        def compiled(value):
            return strategy.experimental_local_results(strategy.run(replica_fn, args=(value,)))[0]

        attached.attach(strategy, _COMPILED, compiled)
    return compiled(tf.constant(1.0 if flag else 0.0)).numpy()


def _agree(callbacks, where: str) -> None:
    model = callbacks.model
    strategy = multi_worker_strategy(model)
    if strategy is None:
        return
    stopping = flag_table(strategy, bool(getattr(model, "stop_training", False))) > 0
    if stopping.any():
        if not stopping.all():
            who = ", ".join(str(i) for i in stopping.nonzero()[0])
            chief.say_once(
                "agreed-stop",
                f"worker(s) {who} set model.stop_training {where}; every worker stops there "
                "(docs: compat/#stopping-on-one-worker-only)",
            )
        model.stop_training = True


def _on_train_begin(original):
    @functools.wraps(original)
    def on_train_begin(self, logs=None):
        original(self, logs)
        attached.attach(self, _BATCH_AGREEMENT, False)
        strategy = multi_worker_strategy(self.model)
        if strategy is not None:
            averaged = STEP_LOGS_REPAIR.active and not attached.attached(strategy, LOCAL_STEP_LOGS)
            mine = any(may_stop_mid_epoch(callback, averaged) for callback in self.callbacks)
            attached.attach(self, _BATCH_AGREEMENT, bool(flag_table(strategy, mine).any()))

    return on_train_begin


def _on_train_batch_end(original):
    @functools.wraps(original)
    def on_train_batch_end(self, batch, logs=None):
        original(self, batch, logs)
        if attached.attached(self, _BATCH_AGREEMENT, False):
            _agree(self, f"after batch {batch}")

    return on_train_batch_end


def _on_epoch_end(original):
    @functools.wraps(original)
    def on_epoch_end(self, epoch, logs=None):
        original(self, epoch, logs)
        _agree(self, f"at the end of epoch {epoch + 1}")

    return on_epoch_end


#: The failure's account on the Keras repairs page (docs: compat/), and the tests of
#: this module's repairs (docs: development/#repairs-and-tests is made from them).
_ACCOUNT = "stopping-on-one-worker-only"
_TESTS = (
    "tests/test_keras_callbacks_multiworker.py::test_plain_keras_callbacks_write_twice_and_hang_on_two_workers",
    "tests/test_keras_callbacks_multiworker.py::test_keras_callbacks_act_once_and_stop_together_on_two_workers",
    "tests/test_keras_callbacks_multiworker.py::test_only_callbacks_that_may_stop_in_a_batch_hook_cost_a_collective_per_batch",
)

REPAIRS = (
    multi_worker_repair(
        "agreed_stop_begin",
        _UPSTREAM,
        "CallbackList.on_train_begin",
        _on_train_begin,
        account=_ACCOUNT,
        tests=_TESTS,
        own_canary=True,
    ),
    multi_worker_repair(
        "agreed_stop_batch",
        _UPSTREAM,
        "CallbackList.on_train_batch_end",
        _on_train_batch_end,
        account=_ACCOUNT,
        tests=_TESTS,
        own_canary=True,
    ),
    multi_worker_repair(
        "agreed_stop_epoch",
        _UPSTREAM,
        "CallbackList.on_epoch_end",
        _on_epoch_end,
        account=_ACCOUNT,
        tests=_TESTS,
        own_canary=True,
    ),
)
