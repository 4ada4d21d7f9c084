"""Repair: ``fit(class_weight=...)`` on a dataset `mk.distribute` made.

Upstream: tensorflow/tensorflow#41290; docs: compat/#class-weights-on-a-distributed-dataset.
Keras turns ``class_weight`` into sample weights by
calling ``.map`` on the input, and a ``tf.distribute.DistributedDataset`` has
no ``map``: ``AttributeError: 'DistributedDataset' object has no attribute
'map'``. The replacement of Keras's ``get_data_adapter`` hands the class
weights to the input's own ``with_class_weight`` (the same `mk.distribute`
call with ``class_weight=``, whose pipeline applies Keras's own class-weight
map before distributing), said once; any other input goes to Keras unchanged.
"""

from __future__ import annotations

from typing import Any

from mirrorkit import distributed_data
from mirrorkit.cluster import chief
from mirrorkit.cluster.workers import every_strategy
from mirrorkit.patching.repair import Repair


def _replacement(original):
    def get_data_adapter(x, *args: Any, class_weight=None, **kwargs: Any):
        rebuild = distributed_data.class_weight_maker(x)
        if class_weight is not None and rebuild is not None:
            chief.say_once(
                "class-weight-routed",
                "fit(class_weight=...) on an mk.distribute dataset: the class weights are "
                "applied in its pipeline before it is distributed (as mk.distribute(..., "
                "class_weight=...)), with Keras's own class-weight map",
            )
            x, class_weight = rebuild(class_weight), None
        return original(x, *args, class_weight=class_weight, **kwargs)

    get_data_adapter.__wrapped__ = original
    return get_data_adapter


REPAIR = Repair(
    name="class_weight",
    upstream="tensorflow#41290",
    module="keras.src.trainers.data_adapters",
    target="get_data_adapter",
    replacement=_replacement,
    applies_to=every_strategy,
    account="class-weights-on-a-distributed-dataset",
    tests=(
        "tests/test_distribute.py::test_class_weight_without_the_repair_is_keras_attribute_error",
        "tests/test_conformance.py::test_two_replicas[class_weight_fit-weights]",
        "tests/test_conformance.py::test_two_workers[class_weight_fit-weights]",
    ),
)
