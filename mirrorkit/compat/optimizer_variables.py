"""Repair: an optimizer creates its variables outside the traced step, under the strategy.

Upstream: keras-team/keras#23085 and #20164, fixed on Keras's master by
#23087 (after 3.15.1); docs: compat/#optimizers-built-inside-the-step.
A Keras optimizer creates its slot variables (Adam's moments, a
``LossScaleOptimizer``'s scale, each optimizer of a ``MultiOptimizer``) the
first time it applies gradients. Under a strategy with several replicas,
inside a traced step (a ``train_step`` applying ``self.d_optimizer`` and
``self.g_optimizer``, as the keras.io GANs do, or a custom ``tf.function``
loop) that creation lands in a ``cond`` branch of the graph and the step
fails: "You must feed a value for placeholder tensor". Keras's fix, applied
here to the Keras releases without it, creates each optimizer variable in
``tf.init_scope()``: eagerly, under the strategy's scope, mirrored, on the
variables the optimizer is first applied to, exactly as on one device.
Where Keras's own ``TFOptimizer`` already defines ``add_variable`` (the fix
has shipped) the repair steps aside.
"""

from __future__ import annotations

import tensorflow as tf

from mirrorkit import internals
from mirrorkit.cluster.workers import spans_replicas
from mirrorkit.patching.repair import Repair

_OPTIMIZER = "keras.src.backend.tensorflow.optimizer"


def _fixed_upstream() -> bool:
    """Whether Keras's ``TFOptimizer`` defines ``add_variable`` itself (keras#23087)."""
    module = internals.load_module(_OPTIMIZER, used_for="the optimizer_variables repair")
    tf_optimizer = internals.require(
        module, "TFOptimizer", name=f"keras {_OPTIMIZER}.TFOptimizer",
        used_for="the optimizer_variables repair",
    )  # fmt: skip
    return "add_variable" in vars(tf_optimizer) and not REPAIR.active  # not our own replacement


def _replacement(original):
    def add_variable(self, *args, **kwargs):
        with tf.init_scope():
            return original(self, *args, **kwargs)

    add_variable.__wrapped__ = original
    return add_variable


REPAIR = Repair(
    name="optimizer_variables",
    upstream="keras-team/keras#23085, #20164 (fixed by #23087)",
    module=_OPTIMIZER,
    target="TFOptimizer.add_variable",
    replacement=_replacement,
    applies_to=spans_replicas,
    needed=lambda: not _fixed_upstream(),
    account="optimizers-built-inside-the-step",
    tests=(
        "tests/test_compat.py::test_custom_loop_with_adam_fails_upstream",
        "tests/test_compat.py::test_custom_loop_with_adam_built_in_the_step",
        "tests/test_compat.py::test_custom_loop_with_adam_after_build",
        "tests/test_own_train_step.py::test_optimizers_under_other_names_fail_upstream",
        "tests/test_own_train_step.py::test_a_model_without_call_and_two_optimizers_trains_as_one_device",
        "tests/test_own_train_step.py::test_loss_scale_and_multi_optimizers_in_a_custom_step_train_as_one_device",
    ),
)
