"""Notice: a custom ``train_step`` under several replicas logs whatever loss it is handed.

Upstream: the keras.io guide "Customizing what happens in fit()"
(``loss = self.compute_loss(...)``, then ``self.loss_tracker.update_state(loss)``);
``docs/compat.md``, "Custom train_step and the logged loss". Keras's losses
return each replica's loss divided by the replica count (so that summed
gradients equal one device's); Keras's own ``train_step`` multiplies it back
before logging, a custom one does not, so its logged loss reads 1/N of one
device's while the weights agree. Nothing can tell from outside what a custom
step logs, so this repair changes nothing: when ``fit`` starts on a model whose
class overrides ``train_step`` under several replicas, it says once, on the
chief, what to log instead (`mk.unscale_loss`).
"""

from __future__ import annotations

from mirrorkit.cluster import chief
from mirrorkit.compat._repair import Repair, spans_replicas
from mirrorkit.scale.custom_step import custom_train_step


def _replacement(original):
    def make_train_function(self, *args, **kwargs):
        owner = custom_train_step(self)
        strategy = self.distribute_strategy
        if owner is not None and strategy.num_replicas_in_sync > 1:
            n = strategy.num_replicas_in_sync
            chief.say_once(
                f"custom-train-step-{owner}",
                f"{owner} overrides train_step: under {n} replicas Keras's losses "
                f"(self.compute_loss, keras.losses.*) return each replica's loss divided by {n}, "
                "so that the summed gradients equal one device's; a loss you log yourself reads "
                f"1/{n} of one device's. Log mk.unscale_loss(loss) (e.g. "
                "self.loss_tracker.update_state(mk.unscale_loss(loss))); keep the scaled loss "
                "for the gradient",
            )
        return original(self, *args, **kwargs)

    make_train_function.__wrapped__ = original
    return make_train_function


REPAIR = Repair(
    name="fit_notices",
    upstream="keras.io guide 'Customizing what happens in fit()'",
    module="keras.src.backend.tensorflow.trainer",
    target="TensorFlowTrainer.make_train_function",
    replacement=_replacement,
    applies_to=spans_replicas,
)
