"""Hook: a train function Keras traces again stays inside the model's step chain.

Not a Keras bug; docs: compat/#the-step-chain. mirrorkit's callbacks
act on each training step through one ordered chain
(`mirrorkit.training.step_hooks`) that stands in for ``model.train_function``.
Keras replaces that attribute whenever it traces the step again
(``make_train_function(force=True)``, a ``fit`` after ``compile``), which
dropped whatever wrapped the old function: ``ThroughputCallback`` listed
before ``NaNGuard`` lost its timer and reported every step as host work.
The replacement of ``TensorFlowTrainer.make_train_function`` puts the new
function back into the chain of a model that has one, and changes nothing
for a model without one. `mirrorkit.training.step_hooks.register` applies it
when the first hook is registered; it stays, and `mirrorkit.compat.active()`
lists it.
"""

from __future__ import annotations

from mirrorkit.cluster.workers import every_strategy
from mirrorkit.patching.repair import ON_FIRST_USE, Repair
from mirrorkit.training import step_hooks


def _replacement(original):
    def make_train_function(self, *args, **kwargs):
        made = original(self, *args, **kwargs)
        if step_hooks.wrap(self) and made is not None:
            return self.train_function  # a caller that uses the returned function gets the chain
        return made

    make_train_function.__wrapped__ = original
    return make_train_function


REPAIR = Repair(  # applied by the first step hook (step_hooks.register)
    name="step_chain",
    upstream="none: mirrorkit's own step hooks (mirrorkit.training.step_hooks)",
    module="keras.src.backend.tensorflow.trainer",
    target="TensorFlowTrainer.make_train_function",
    replacement=_replacement,
    applies_to=every_strategy,
    place=1,  # above fit_notices: what the chain takes in is the function Keras made
    when=ON_FIRST_USE,
    applied_when=("with the first step hook (ThroughputCallback, NaNGuard)"),
    feature="the step hooks kept around a re-traced train function",
    account="the-step-chain",
    tests=(
        "tests/test_step_hooks.py::test_every_order_of_the_callbacks_gives_the_same_verdicts_figures_and_weights",
        "tests/test_step_hooks.py::test_hooks_run_by_their_place_whatever_the_order_they_came_in",
        "tests/test_step_hooks.py::test_a_retrace_and_a_second_fit_keep_the_chain_and_removing_restores_keras",
    ),
)
