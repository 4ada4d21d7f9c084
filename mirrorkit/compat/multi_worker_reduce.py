"""Repair: average scalar losses and metrics across workers without ``axis=0``.

Upstream: keras-team/keras#20585; docs: compat/#multi-worker-log-reduction. In
``keras/src/backend/tensorflow/trainer.py``, ``reduce_per_replica``'s
multi-worker branch calls ``strategy.reduce("MEAN", v, axis=0)`` on every log
value; losses and metrics are scalars, so it raises ``Invalid reduction
dimension 0 for input with 0 dimensions``. The single-host branch averages the
replicas' values (``tf.reduce_mean(local_results, axis=0)``); the replacement
does the same across workers with ``strategy.reduce("MEAN", v, axis=None)``
and leaves every other reduction (``concat`` for ``predict``, ``sum``,
``first``) to Keras. Tested on the pairs listed at docs: compat/#tested-range.

With ``mk.build(..., step_logs="local")`` the strategy carries
`LOCAL_STEP_LOGS` and per-step logs are averaged over this worker's replicas
only: no collective per step. Epoch logs do not come from here: Keras reads
them from the metrics' variables at epoch end, which sums them over every
replica.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from mirrorkit import internals
from mirrorkit.cluster import workers
from mirrorkit.patching import attached
from mirrorkit.patching.repair import Repair

#: What `mirrorkit.patching.attached` keeps for a strategy whose per-step logs are averaged
#: over this worker's replicas only.
LOCAL_STEP_LOGS = "multi_worker_reduce.local_step_logs"


def _local_mean(value, strategy):
    local = strategy.experimental_local_results(value)
    return local[0] if len(local) == 1 else tf.reduce_mean(tf.stack(local), axis=0)


#: The Keras module that holds the reduction and Keras's multi-worker test.
_TRAINER = "keras.src.backend.tensorflow.trainer"


def _replacement(original):
    # Keras's own test for the branch that fails, so the repair replaces exactly that branch.
    multi_worker = internals.load(
        _TRAINER,
        "_collective_all_reduce_multi_worker",
        used_for="the multi_worker_reduce repair (multi-worker losses and metrics)",
    )

    def reduce_per_replica(values, strategy, reduction):
        if reduction in ("auto", "mean") and multi_worker(strategy):
            if attached.attached(strategy, LOCAL_STEP_LOGS, False):
                return keras.tree.map_structure(lambda v: _local_mean(v, strategy), values)
            return keras.tree.map_structure(lambda v: strategy.reduce("MEAN", v, axis=None), values)
        return original(values, strategy, reduction)

    reduce_per_replica.__wrapped__ = original
    return reduce_per_replica


REPAIR = Repair(
    name="multi_worker_reduce",
    upstream="keras-team/keras#20585",
    module=_TRAINER,
    target="reduce_per_replica",
    replacement=_replacement,
    applies_to=workers.is_multi_worker,
    account="multi-worker-log-reduction",
    tests=(
        "tests/test_multiworker.py::test_multi_worker_scalar_reduce_fails_upstream",
        "tests/test_multiworker.py::test_two_workers_train_like_one_process",
        "tests/test_multiworker.py::test_evaluate_and_predict_match_one_process",
    ),
)
