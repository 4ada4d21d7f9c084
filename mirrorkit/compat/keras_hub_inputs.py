"""Repair: keras-hub tasks take an `mk.distribute` dataset in ``fit``, ``evaluate`` and ``predict``.

Upstream: keras-hub 0.32, ``keras_hub.src.utils.pipeline_model._build_dataset``;
docs: compat/#keras-hub-tasks. A keras-hub ``Task`` (``BertTextClassifier``,
...) is a ``PipelineModel``: its ``fit``, ``evaluate`` and ``predict`` pass a
``tf.data.Dataset`` (or a grain dataset) through and turn anything else into
one with ``tf.data.Dataset.from_tensor_slices``, then map the task's
preprocessor over it. A distributed dataset is neither, so it fails with
``AttributeError: 'DistributedDatasetSpec' object has no attribute
'_to_batched_tensor_list'``, on one host and across workers. The replacement
hands a distributed dataset to Keras as it is, as keras-hub hands a
``tf.data.Dataset``; where the task has a preprocessor, which cannot be mapped
over batches already split between replicas, it raises an error that says to
preprocess in the pipeline instead (``mk.distribute(..., preprocess=
task.preprocessor)``) with the task's preprocessor off for that call. Any
other input reaches keras-hub unchanged.

keras-hub is an optional extra (``pip install "mirrorkit[hub]"``). The repair
is applied once keras-hub is imported, before or after ``mk.strategy()`` and
`mk.distribute` (`mirrorkit.compat.apply_when_imported`).
"""

from __future__ import annotations

import sys

import tensorflow as tf

from mirrorkit.cluster.workers import every_strategy
from mirrorkit.patching.repair import Repair

_PIPELINE = "keras_hub.src.utils.pipeline_model"


def _check_nothing_else(x, y, sample_weight, batch_size) -> None:
    given = [
        name
        for name, value in (("y", y), ("sample_weight", sample_weight), ("batch_size", batch_size))
        if value is not None
    ]
    if given:
        raise ValueError(
            f"A distributed dataset was passed with {', '.join(given)}: the dataset already holds "
            "its labels, sample weights and batches (mk.distribute((x, y, sample_weight), "
            "strategy, global_batch_size=...)). Leave out " + ", ".join(given) + "."
        )


def _replacement(original):
    def _build_dataset(x, y, sample_weight, batch_size, preprocess_samples, *args, **kwargs):
        if not isinstance(x, tf.distribute.DistributedDataset):
            return original(x, y, sample_weight, batch_size, preprocess_samples, *args, **kwargs)
        _check_nothing_else(x, y, sample_weight, batch_size)
        task = getattr(preprocess_samples, "__self__", None)  # the bound Task.preprocess_samples
        if getattr(task, "preprocessor", None) is not None:  # keras-hub's public attribute
            name = type(task).__name__
            raise ValueError(
                f"{name} has a preprocessor, which keras-hub maps over a tf.data.Dataset; a "
                "distributed dataset's batches are already split between the replicas, so it "
                "cannot be preprocessed here. Preprocess in the pipeline instead: "
                "data = mk.distribute(..., preprocess=task.preprocessor), then call fit, "
                "evaluate or predict with task.preprocessor = None (set it back afterwards for "
                "raw inputs), or build the task with preprocessor=None."
            )
        return x

    _build_dataset.__wrapped__ = original
    return _build_dataset


REPAIR = Repair(
    name="keras_hub_inputs",
    upstream="keras-hub 0.32 PipelineModel._build_dataset",
    module=_PIPELINE,
    target="_build_dataset",
    replacement=_replacement,
    applies_to=every_strategy,  # mk.distribute's input is distributed on every strategy
    needed=lambda: "keras_hub" in sys.modules,
    account="keras-hub-tasks",
    tests=(
        "tests/test_keras_hub.py::test_a_task_on_two_replicas_equals_one_device",
        "tests/test_keras_hub.py::test_a_task_on_two_workers_equals_one_device_and_the_workers_agree",
        "tests/test_keras_hub.py::test_a_task_with_a_preprocessor_is_told_to_preprocess_in_the_pipeline",
        # its canary: a task without the repair fails on an mk.distribute dataset
        "tests/test_keras_hub.py::test_a_task_fails_on_a_distributed_dataset_upstream",
    ),
)
