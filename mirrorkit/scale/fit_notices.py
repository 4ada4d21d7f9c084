"""Notices at ``fit``: a custom ``train_step``, and batch normalisation that trains per replica.

Not Keras bugs; docs: compat/#losses-in-your-own-train_step and
"Batch normalisation at fit". When ``fit`` (or ``train_on_batch``) makes its
train function under several replicas, the chief says once:

- for a model whose class overrides ``train_step``: that inside ``fit``
  every loss is one device's loss (`mirrorkit.compat.one_device_loss`) and
  the replicas' gradients are combined by the loss's form (a mean averaged, a
  sum summed: `mirrorkit.compat.one_device_tape`), so the step is written as
  for one device, and what that rules out (a loss divided by the replica
  count by hand);
- for trainable ``BatchNormalization`` layers without ``synchronized=True``
  (`mirrorkit.scale.batchnorm.check`), whatever built the model: `mk.build`,
  ``strategy.scope()``, or a base model unfrozen since (``trainable = True``
  before compiling again, as the transfer-learning guide does).

The replacement of ``make_train_function`` changes nothing else. This module is in
`mirrorkit.patching.catalogue`, so `mirrorkit.compat.enable` (which ``mk.strategy()`` calls)
applies it with the other repairs, for every strategy spanning replicas.
"""

from __future__ import annotations

from mirrorkit.cluster import chief
from mirrorkit.cluster.workers import spans_replicas
from mirrorkit.patching.repair import Repair
from mirrorkit.scale import batchnorm
from mirrorkit.scale.custom_step import custom_train_step


def say_custom_step(owner: str, replicas: int) -> None:
    """Says once that `owner`'s ``train_step`` sees one device's losses under `replicas`."""
    chief.say_once(
        f"custom-train-step-{owner}",
        f"{owner} overrides train_step: inside fit, mirrorkit makes every loss one device's "
        f"loss on each replica's part of the batch and combines the {replicas} replicas' "
        "gradients as one device's: a mean over the batch averaged, a sum over the batch "
        "summed (read from the traced step). Write and log it as for one device; do not divide "
        "a loss by the replica count yourself",
    )


def _replacement(original):
    def make_train_function(self, *args, **kwargs):
        strategy = self.distribute_strategy
        if spans_replicas(strategy):
            owner = custom_train_step(self)
            if owner is not None:
                say_custom_step(owner, strategy.num_replicas_in_sync)
            batchnorm.check(self, strategy)
        return original(self, *args, **kwargs)

    make_train_function.__wrapped__ = original
    return make_train_function


REPAIR = Repair(
    name="fit_notices",
    upstream="keras.io guide 'Customizing what happens in fit()'; keras-team/keras#20285",
    module="keras.src.backend.tensorflow.trainer",
    target="TensorFlowTrainer.make_train_function",
    replacement=_replacement,
    applies_to=spans_replicas,
    feature="the notices at fit about a custom train_step and batch normalisation",
    account="losses-in-your-own-train_step",
    tests=(  # the notices themselves; the failures they name have their own repairs
        "tests/test_check_equivalence.py::test_the_guide_step_logs_one_device_loss_and_is_told_so",
        "tests/test_own_train_step.py::test_batch_norm_is_said_at_fit_once_the_base_is_unfrozen",
        "tests/test_keras_io_examples.py::test_final_weights_as_one_device[transfer_learning]",
    ),
)
