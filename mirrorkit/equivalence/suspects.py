"""What in a model makes N replicas train differently from one device, found by inspection.

`mk.check_equivalence` names these when the weights differ: layers that draw
random numbers (each replica draws its own; a layer whose rates are all 0,
such as a GRU with ``dropout=0``, draws none), batch normalisation with
per-replica statistics, a custom ``train_step`` (whose losses are weighted by
their form, a mean or a sum over the batch, as one device's;
`mirrorkit.compat.one_device_tape`), a loss whose form mirrorkit could not read
(`mirrorkit.compat.one_device_tape.unread`) and an overridden ``compute_loss``
(a loss that compares the examples of a batch sees only the replica's part,
unless it gathers them with `mk.all_gather`). A loss reduced with
``reduction="sum"``, or summed by hand, is no suspect: inside ``fit`` it is
one device's sum over the global batch.
"""

from __future__ import annotations

from typing import Any

import keras

from mirrorkit.compat import one_device_tape
from mirrorkit.scale.batchnorm import all_layers, unsynchronized_batch_norm
from mirrorkit.scale.custom_step import custom_train_step, overrides

#: The attributes that say how much a Keras random layer draws (0: it draws nothing).
_RATES = ("rate", "dropout", "recurrent_dropout", "stddev")


def find(model: keras.Model) -> dict[str, Any]:
    """The suspects in `model`, as plain data (it crosses processes).

    Args:
        model: a built, compiled Keras model.

    Returns:
        ``random``: ``[(layer name, class name)]`` of layers with a Keras
        seed generator; ``batch_norm``: unsynchronised BatchNormalization
        layer names; ``train_step``: the class that overrides ``train_step``;
        ``compute_loss``: the class that overrides ``compute_loss``;
        ``loss_forms``: ``[(where, form)]`` of the losses whose form the
        model's steps could not read (averaged as means).
    """
    layers = all_layers(model)
    random = [(layer.name, type(layer).__name__) for layer in layers if _draws_random(layer)]
    return {
        "random": random,
        "batch_norm": unsynchronized_batch_norm(model),
        "train_step": custom_train_step(model),
        "compute_loss": overrides(model, "compute_loss"),
        "loss_forms": one_device_tape.unread(model),
    }


def _draws_random(layer: keras.layers.Layer) -> bool:
    """Whether `layer` has a seed generator and a rate that is not 0 (or no rate at all)."""
    if not any(isinstance(v, keras.random.SeedGenerator) for v in vars(layer).values()):
        return False
    rates = [getattr(layer, name) for name in _RATES if hasattr(layer, name)]
    rates = [rate for rate in rates if isinstance(rate, (int, float))]
    return not rates or any(rate != 0 for rate in rates)


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
            "losses are one device's on its part of the batch, and mirrorkit weights each "
            "loss's gradient by its form (a mean over the batch averaged, a sum summed); a loss "
            "divided by the replica count by hand is off by N, and a value the step logs as a "
            "sum over the batch is its replica's share"
        )
    for where, form in found.get("loss_forms", ()):
        lines.append(
            f"a loss whose form mirrorkit cannot read: {where} is {form}, so its gradient is "
            "averaged as a mean's; write each term as a mean or a sum over the batch of "
            "per-example values, or compute a nonlinear function of the batch on "
            "mk.all_gather(...) of it"
        )
    if found.get("compute_loss"):
        lines.append(
            f"custom compute_loss ({found['compute_loss']}.compute_loss): a loss that compares "
            "the examples of a batch (in-batch negatives, a contrastive loss, an in-batch "
            "softmax) sees only each replica's part of it; gather the other replicas' examples "
            "with mk.all_gather and place this replica's positives with mk.all_gather_offset"
        )
    return lines
