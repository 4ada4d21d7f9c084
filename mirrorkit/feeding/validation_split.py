"""Repair: ``fit(..., validation_split=...)`` on a distributed dataset names the fix.

Upstream: Keras's own limit (``validation_split`` slices tensors and NumPy
arrays only); docs: compat/#validation_split-on-a-distributed-dataset.
Keras's error ("Argument `validation_split` is only supported for tensors or
NumPy arrays") does not say what to do with a dataset `mk.distribute` (or
``strategy.experimental_distribute_dataset``) made. The replacement of
``array_slicing.train_validation_split`` raises the same ``ValueError`` type
with the split written out; any other input reaches Keras unchanged.
"""

from __future__ import annotations

import tensorflow as tf

from mirrorkit.cluster.workers import every_strategy
from mirrorkit.patching.repair import Repair

_DISTRIBUTED = (tf.distribute.DistributedDataset, tf.data.Dataset)


def _replacement(original):
    def train_validation_split(arrays, validation_split):
        x = arrays[0] if isinstance(arrays, (tuple, list)) and arrays else arrays
        if isinstance(x, _DISTRIBUTED):
            raise ValueError(
                f"fit(validation_split={validation_split}) splits NumPy arrays or tensors, and x "
                f"is a {type(x).__name__}. Split the arrays before mk.distribute (Keras takes "
                "the last part): n = int(len(x) * (1 - validation_split)); "
                "fit(mk.distribute((x[:n], y[:n]), ...), validation_data=mk.distribute("
                "(x[n:], y[n:]), ..., for_eval=True)); or pass the arrays to fit as they are "
                "under the strategy's scope."
            )
        return original(arrays, validation_split)

    train_validation_split.__wrapped__ = original
    return train_validation_split


REPAIR = Repair(  # compat.enable applies it, on every strategy (mirrorkit.patching.catalogue)
    name="validation_split_message",
    upstream="Keras (validation_split slices arrays only)",
    module="keras.src.trainers.data_adapters.array_slicing",
    target="train_validation_split",
    replacement=_replacement,
    applies_to=every_strategy,
    feature="an error that says how to split a distributed dataset",
    account="validation_split-on-a-distributed-dataset",
    tests=(
        "tests/test_conformance.py::test_two_replicas[validation_split_distributed-error]",
        "tests/test_errors_table.py::test_row_still_gets_its_error[fit-validation-split-dataset]",
    ),
)
