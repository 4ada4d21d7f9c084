"""What in a model makes N replicas train differently from one device, found by inspection.

`mk.check_equivalence` names these when the weights differ: layers that draw
random numbers (each replica draws its own), batch normalisation with
per-replica statistics, a loss summed instead of averaged over the global
batch, and a custom ``train_step`` (which must average over the global batch
itself).
"""

from __future__ import annotations

from typing import Any

import keras

from mirrorkit.scale.batchnorm import all_layers, unsynchronized_batch_norm
from mirrorkit.scale.custom_step import custom_train_step


def find(model: keras.Model) -> dict[str, Any]:
    """The suspects in `model`, as plain data (it crosses processes).

    Args:
        model: a built, compiled Keras model.

    Returns:
        ``random``: ``[(layer name, class name)]`` of layers with a Keras
        seed generator; ``batch_norm``: unsynchronised BatchNormalization
        layer names; ``loss_reduction``: the loss's reduction when it is not
        an average; ``train_step``: the class that overrides ``train_step``.
    """
    layers = all_layers(model)
    random = [
        (layer.name, type(layer).__name__)
        for layer in layers
        if any(isinstance(v, keras.random.SeedGenerator) for v in vars(layer).values())
    ]
    return {
        "random": random,
        "batch_norm": unsynchronized_batch_norm(model),
        "loss_reduction": _summed_reduction(getattr(model, "loss", None)),
        "train_step": custom_train_step(model),
    }


def describe(found: dict[str, Any]) -> list[str]:
    """One line per suspect in `found`, saying what to do."""
    lines = []
    if found["random"]:
        names = ", ".join(f"{name} ({kind})" for name, kind in found["random"])
        lines.append(
            f"random layers: {names} draw different random numbers on each replica than on one "
            "device; check equivalence with them off (e.g. rate=0), they cannot match by design"
        )
    if found["batch_norm"]:
        lines.append(
            f"batch norm without synchronisation: {', '.join(found['batch_norm'])} use each "
            "replica's batch statistics; use BatchNormalization(synchronized=True)"
        )
    if found["loss_reduction"]:
        lines.append(
            f"the loss is not averaged over the global batch (reduction="
            f"{found['loss_reduction']!r}): the replicas' losses add up to N times one device's; "
            "use reduction='sum_over_batch_size' (the default) or scale the learning rate"
        )
    if found["train_step"]:
        lines.append(
            f"custom train_step ({found['train_step']}.train_step): under N replicas it must "
            "average over the GLOBAL batch, e.g. use self.compute_loss(...) (scaled by the "
            "replica count) or divide a per-example sum by the global batch size, not sum the "
            "replicas' averages"
        )
    return lines


def _summed_reduction(loss: Any) -> str | None:
    reduction = getattr(loss, "reduction", None)
    if reduction in ("sum", "none", None):
        return reduction
    return None
