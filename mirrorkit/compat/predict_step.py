"""Repairs: ``predict`` and ``predict_on_batch`` on several replicas, with and without XLA.

Upstream: none found (docs: compat/#predict-across-replicas). Under a
strategy with several replicas (Keras 3.10-3.15.1, TensorFlow 2.21):

- ``jit_compile=True``: each replica's predict step is an XLA function.
  For a model that ``predict`` itself builds (no ``keras.Input``, a
  subclassed model, never called before) creating its variables there fails
  ("We failed to lift variable creations out of this tf.function, so this
  tf.function cannot be run on XLA"); on Keras 3.10 / TensorFlow 2.17 even a
  built model fails ("Trying to access resource ... located in device
  CPU:1 from device CPU:0"). One device predicts. The replacement of
  ``make_predict_function`` compiles that step without XLA and says so
  once, as `mirrorkit.compat.step_function` does for the train and test step.
- ``predict_on_batch(x)`` hands the whole batch to every replica and
  concatenates their outputs: N copies of each row. The replacement gives
  each replica its own rows (the first ``n % N`` replicas one more), as
  ``predict`` splits a batch, so the result is one device's.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from mirrorkit.cluster import chief
from mirrorkit.cluster.workers import spans_replicas
from mirrorkit.compat.step_function import check_seen, step_compiled_as
from mirrorkit.patching.repair import Repair

_TRAINER = "keras.src.backend.tensorflow.trainer"


def _predict_function(original):
    def make_predict_function(self, force=False):
        if self.predict_function is not None and not force:
            return self.predict_function
        strategy = self.distribute_strategy
        if self.run_eagerly or not self.jit_compile or not spans_replicas(strategy):
            return original(self, force)
        chief.say_once(
            "predict-no-xla",
            f"jit_compile=True: XLA cannot compile predict's step on the "
            f"{strategy.num_replicas_in_sync} replicas of {type(strategy).__name__} (it cannot "
            "create a model's variables there, nor reach another replica's); predict's step "
            "runs compiled without XLA",
        )
        with step_compiled_as(inline=False) as proxy:
            made = original(self, force)
        check_seen(proxy)
        return made

    make_predict_function.__wrapped__ = original
    return make_predict_function


def _split_rows(x, strategy: tf.distribute.Strategy):
    """`x` (arrays or tensors, nested) as per-replica values: each replica its own rows."""
    parts = keras.tree.flatten(x)
    rows = int(parts[0].shape[0])
    replicas = strategy.num_replicas_in_sync
    bounds = np.cumsum([0] + [rows // replicas + (i < rows % replicas) for i in range(replicas)])
    tensors = keras.tree.map_structure(tf.convert_to_tensor, x)

    def rows_of(context):
        replica = context.replica_id_in_sync_group
        start, stop = int(bounds[replica]), int(bounds[replica + 1])
        return keras.tree.map_structure(lambda t: t[start:stop], tensors)

    return strategy.experimental_distribute_values_from_function(rows_of)


def _predict_on_batch(original):
    def predict_on_batch(self, x):
        strategy = self.distribute_strategy
        if not spans_replicas(strategy) or not keras.tree.flatten(x):
            return original(self, x)
        self.make_predict_function()
        outputs = self.predict_function([(_split_rows(x, strategy),)])
        return keras.tree.map_structure(_to_numpy, outputs)

    predict_on_batch.__wrapped__ = original
    return predict_on_batch


def _to_numpy(value):
    return value if isinstance(value, tf.RaggedTensor) else keras.ops.convert_to_numpy(value)


REPAIRS = (
    Repair(
        name="predict_without_xla_build",
        upstream="predict with jit_compile across replicas (docs: compat/#predict-across-replicas)",
        module=_TRAINER,
        target="TensorFlowTrainer.make_predict_function",
        replacement=_predict_function,
        applies_to=spans_replicas,
        account="predict-across-replicas",
        tests=(
            "tests/test_predict_replicas.py::test_keras_alone_cannot_predict_with_xla_or_one_batch_across_replicas[predict_without_xla_build]",
            "tests/test_predict_replicas.py::test_xla_is_left_out_of_predict_across_replicas_and_said_once",
            "tests/test_predict_replicas.py::test_two_replicas_predict_as_one_device",
        ),
    ),
    Repair(
        name="predict_on_batch_split",
        upstream="predict_on_batch gives every replica the whole batch "
        "(docs: compat/#predict-across-replicas)",
        module=_TRAINER,
        target="TensorFlowTrainer.predict_on_batch",
        replacement=_predict_on_batch,
        applies_to=spans_replicas,
        account="predict-across-replicas",
        tests=(
            "tests/test_predict_replicas.py::test_keras_alone_cannot_predict_with_xla_or_one_batch_across_replicas[predict_on_batch_split]",
            "tests/test_predict_replicas.py::test_predict_on_batch_splits_an_uneven_batch_into_one_devices_rows",
        ),
    ),
)
