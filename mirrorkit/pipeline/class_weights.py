"""Class weights as per-example weights, made in the input pipeline before it is distributed.

Keras turns ``fit(class_weight=...)`` into sample weights by mapping the
dataset, which a distributed dataset cannot do (tensorflow#41290:
``'DistributedDataset' object has no attribute 'map'``). `mk.distribute`
takes ``class_weight=`` and applies Keras's own mapping to its pipeline, so
the weights, and so the loss, are what one device computes with
``fit(class_weight=...)``; `mirrorkit.compat.class_weight` routes a
``fit(class_weight=...)`` on a dataset `mk.distribute` made to it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from mirrorkit import internals

_USED_FOR = "mk.distribute(class_weight=), the same class weighting as Keras's fit"


def check(class_weight: Any, for_eval: bool) -> dict[int, float] | None:
    """Returns `class_weight` as ``{class id: weight}``, or raises naming what is wrong.

    Args:
        class_weight: None, or a mapping of integer class ids to weights.
        for_eval: whether the input is for evaluation (which Keras never weights by class).

    Raises:
        TypeError: not a mapping of integers to numbers.
        ValueError: given for evaluation input, or empty.

    Example:
    ```python
    from mirrorkit.pipeline.class_weights import check

    assert check({0: 1, 1: 5}, for_eval=False) == {0: 1.0, 1: 5.0}
    ```
    """
    if class_weight is None:
        return None
    if not isinstance(class_weight, Mapping) or not all(
        isinstance(k, int) and not isinstance(k, bool) and k >= 0 for k in class_weight
    ):
        raise TypeError(
            "class_weight must be a dict of class ids (integers from 0) to weights, e.g. "
            f"{{0: 1.0, 1: 5.0}}; got {class_weight!r}"
        )
    if not class_weight:
        raise ValueError("class_weight is empty; pass a weight per class, or leave it None")
    if for_eval:
        raise ValueError(
            "class_weight= weights training only (Keras's evaluate and validation data are "
            "not weighted by class); drop it from the for_eval=True input."
        )
    try:
        return {int(k): float(v) for k, v in class_weight.items()}
    except (TypeError, ValueError):
        raise TypeError(f"class_weight's weights must be numbers; got {class_weight!r}") from None


def weighting(class_weight: Mapping[int, float]) -> Callable[..., Any]:
    """Keras's own map from ``(x, y)`` batches to ``(x, y, weight of y's class)``."""
    make = internals.load(
        "keras.src.trainers.data_adapters.tf_dataset_adapter",
        "make_class_weight_map_fn",
        used_for=_USED_FOR,
    )
    return make(dict(class_weight))
