"""What in a model makes N replicas train differently from one device, found by inspection.

`mk.check_equivalence` names these when the weights differ: layers that draw
random numbers (each replica draws its own), batch normalisation with
per-replica statistics, and a custom ``train_step`` (whose losses must be
means over the batch, as one device's; `mirrorkit.compat.one_device_loss`).
A loss reduced with ``reduction="sum"`` is no suspect: inside ``fit`` it is
one device's sum over the global batch.
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
        layer names; ``train_step``: the class that overrides ``train_step``.
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
            "replica's batch statistics; use BatchNormalization(synchronized=True) or "
            "mk.synchronize_batch_norm(model)"
        )
    if found["train_step"]:
        lines.append(
            f"custom train_step ({found['train_step']}.train_step): inside fit each replica's "
            "losses are one device's on its part of the batch and the gradients are averaged, "
            "so every loss must be a mean over the batch (ops.mean, keras.losses, "
            "self.compute_loss, tf.nn.compute_average_loss); a loss summed over the batch by "
            "hand is 1/N of one device's, one divided by the global batch size or the replica "
            "count by hand is off by N"
        )
    return lines
