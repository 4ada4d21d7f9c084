"""absl flags for data-parallel scripts: `define_flags`, then build everything from them.

A script defines the flags once and turns them into TensorFlow's and Keras's
own objects with one call each. Flag names follow TensorFlow Model Garden
(``official/common/flags_core``) where it has one; the rest are mirrorkit's.

| flag | goes to |
| --- | --- |
| ``--distribution_strategy`` | ``mk.strategy(kind)`` (`KINDS`) |
| ``--num_gpus``, ``--cpu_replicas`` | ``mk.strategy(num_gpus=, cpu_replicas=)`` |
| ``--all_reduce_alg`` | ``mk.strategy(all_reduce=)`` |
| ``--bucket_mb``, ``--collective_timeout`` | ``mk.strategy(bucket_mb=, timeout_s=)`` |
| ``--num_packs`` | ``NcclAllReduce``/``HierarchicalCopyAllReduce(num_packs=)`` |
| ``--worker_hosts``, ``--task_index`` | this process's ``TF_CONFIG`` |
| ``--batch_size`` (global) | ``mk.distribute(global_batch_size=)`` |
| ``--per_replica_batch_size`` | ``mk.distribute(per_replica_batch_size=)`` |
| ``--gradient_compression``, ``--step_logs`` | ``mk.build`` via `build_from_flags` |
| ``--mixed_precision`` | Keras's global dtype policy, in `build_from_flags` |
| ``--throughput_json`` | ``mk.ThroughputCallback(json_path=)`` via `callbacks_from_flags` |

Contradictory or invalid combinations fail while absl parses the command line,
before any TensorFlow work, with a message naming the flags. A flag the user
set is never overridden by ``TF_CONFIG`` or Slurm: where they disagree, that is
an error naming both. Importing this package does not import TensorFlow.

Example:
```python
# train.py -- run with: python train.py --cpu_replicas 2
import keras
import numpy as np
from absl import app

from mirrorkit import flags as mk_flags

mk_flags.define_flags(per_replica_batch_size=32)


def make_model():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def main(argv):
    x, y = np.ones((256, 4), "float32"), np.ones((256, 1), "float32")
    strategy = mk_flags.strategy_from_flags()
    model = mk_flags.build_from_flags(make_model, strategy)
    train = mk_flags.distribute_from_flags((x, y), strategy)
    model.fit(train, epochs=3, callbacks=mk_flags.callbacks_from_flags())


if __name__ == "__main__":
    app.run(main)
```
"""

from mirrorkit.flags.checks import (
    ALL_REDUCE_ALGS,
    KINDS,
    MIXED_PRECISION,
    cluster_conflict,
    combination_problem,
)
from mirrorkit.flags.consume import (
    apply_cluster_flags,
    batch_size_kwargs,
    build_from_flags,
    callbacks_from_flags,
    distribute_from_flags,
    set_num_packs,
    strategy_from_flags,
)
from mirrorkit.flags.definitions import FLAG_NAMES, define_flags

__all__ = [
    "ALL_REDUCE_ALGS",
    "FLAG_NAMES",
    "KINDS",
    "MIXED_PRECISION",
    "apply_cluster_flags",
    "batch_size_kwargs",
    "build_from_flags",
    "callbacks_from_flags",
    "cluster_conflict",
    "combination_problem",
    "define_flags",
    "distribute_from_flags",
    "set_num_packs",
    "strategy_from_flags",
]
