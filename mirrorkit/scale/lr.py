"""Learning rate for the global batch: `scale_learning_rate` and the `WarmUp` schedule.

Going from 1 to N replicas multiplies the global batch by N. Goyal et al.
(2017, "Accurate, Large Minibatch SGD") keep accuracy by scaling the learning
rate with the batch (the linear rule) and ramping it up over the first epochs
(gradual warm-up); adaptive optimizers are often scaled by the square root
instead. `WarmUp` is a Keras `LearningRateSchedule`, so it is saved with the
model and composes with the user's own schedule: warm-up first, then theirs.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import keras

from mirrorkit.cluster import chief
from mirrorkit.number_checks import positive_int, positive_number

#: The scaling rules `scale_learning_rate` accepts.
RULES = ("linear", "sqrt")


def scale_learning_rate(
    base_lr: float,
    base_batch: int,
    global_batch: int,
    rule: str = "linear",
    *,
    warmup_epochs: float | None = None,
    warmup_steps: int | None = None,
    steps_per_epoch: int | None = None,
) -> float | WarmUp:
    """The learning rate for `global_batch`, given one tuned for `base_batch`.

    ``rule="linear"`` multiplies `base_lr` by ``global_batch / base_batch``
    (SGD, Goyal et al. 2017); ``rule="sqrt"`` by its square root (often
    better for Adam and friends). The result is said once on the chief, e.g.
    ``learning rate 0.1 x 256/32 = 0.8, warm-up 5 epochs``.

    With ``warmup_epochs`` (and ``steps_per_epoch``) or ``warmup_steps`` it
    returns a `WarmUp` schedule that ramps linearly from `base_lr` to the
    scaled rate, as in Goyal et al.; pass it as the optimizer's
    ``learning_rate``.

    Args:
        base_lr: the learning rate tuned for `base_batch`.
        base_batch: the global batch size `base_lr` was tuned for.
        global_batch: the global batch size now (per-replica batch x replicas).
        rule: ``"linear"`` or ``"sqrt"``.
        warmup_epochs: warm up over this many epochs; needs `steps_per_epoch`.
        warmup_steps: warm up over this many optimizer steps instead.
        steps_per_epoch: optimizer steps per epoch, to turn epochs into steps.

    Returns:
        The scaled learning rate (a float), or a `WarmUp` schedule reaching
        it when a warm-up was asked for.

    Raises:
        ValueError: a non-positive rate or batch, an unknown rule, or an
            incomplete or contradictory warm-up.

    Example:
    ```python
    import keras
    import mirrorkit as mk

    strategy = mk.strategy(cpu_replicas=2)
    global_batch = 32 * strategy.num_replicas_in_sync
    lr = mk.scale_learning_rate(0.1, 32, global_batch, warmup_epochs=5, steps_per_epoch=100)
    optimizer = keras.optimizers.SGD(learning_rate=lr, momentum=0.9)
    ```
    """
    _check_positive("base_lr", base_lr, number=True)
    _check_positive("base_batch", base_batch)
    _check_positive("global_batch", global_batch)
    if rule not in RULES:
        raise ValueError(f"rule must be one of {', '.join(map(repr, RULES))}; got {rule!r}")
    ratio = global_batch / base_batch
    scaled = base_lr * (ratio if rule == "linear" else math.sqrt(ratio))
    factor = f"{global_batch}/{base_batch}"
    factor = factor if rule == "linear" else f"sqrt({factor})"
    message = f"learning rate {base_lr:g} x {factor} = {scaled:g}"
    steps = _warmup_steps(warmup_epochs, warmup_steps, steps_per_epoch)
    if steps is None:
        chief.say_once(f"lr-{message}", message)
        return scaled
    if warmup_epochs is not None:
        message += f", warm-up {warmup_epochs:g} epochs ({steps} steps)"
    else:
        message += f", warm-up {steps} steps"
    chief.say_once(f"lr-{message}", message)
    return WarmUp(scaled, warmup_steps=steps, initial_learning_rate=base_lr, say=False)


@keras.saving.register_keras_serializable(package="mirrorkit")
class WarmUp(keras.optimizers.schedules.LearningRateSchedule):
    """Ramps the learning rate up linearly, then follows a rate or schedule.

    At step ``s`` (``optimizer.iterations``) it returns ``start + (target(s) - start) *
    s / warmup_steps`` while ``s < warmup_steps``, and ``target(s)`` after,
    where ``target`` is the constant rate or the user's schedule, evaluated
    at the same absolute step (so a schedule's milestones keep their
    meaning). The value is continuous at the end of the warm-up. It is a
    Keras schedule: ``get_config`` saves it with the model.

    Args:
        after: a learning rate (float) or a Keras `LearningRateSchedule` to
            follow once warmed up.
        warmup_steps: the number of steps to ramp over (>= 1), counted as Keras counts
            ``optimizer.iterations``: with ``gradient_accumulation_steps=K``, K per
            update of the weights.
        initial_learning_rate: the rate at step 0 (default 0.0).
        name: an optional name.
        say: say the warm-up once on the chief (default True).

    Example:
    ```python
    import keras
    import mirrorkit as mk

    decay = keras.optimizers.schedules.CosineDecay(0.8, decay_steps=10_000)
    schedule = mk.WarmUp(decay, warmup_steps=500, initial_learning_rate=0.1)
    optimizer = keras.optimizers.SGD(learning_rate=schedule, momentum=0.9)
    ```
    """

    def __init__(
        self,
        after: float | keras.optimizers.schedules.LearningRateSchedule,
        warmup_steps: int,
        initial_learning_rate: float = 0.0,
        name: str | None = None,
        say: bool = True,
    ):
        super().__init__()
        if isinstance(after, dict):  # from get_config, via from_config
            after = keras.optimizers.schedules.deserialize(after)
        if not isinstance(after, keras.optimizers.schedules.LearningRateSchedule):
            if isinstance(after, bool) or not isinstance(after, numbers.Real):
                raise ValueError(
                    "WarmUp's `after` must be a learning rate (a float) or a "
                    "keras.optimizers.schedules.LearningRateSchedule; got "
                    f"{type(after).__name__}"
                )
            _check_positive("the learning rate after the warm-up", after, number=True)
        _check_positive("warmup_steps", warmup_steps)
        if (
            isinstance(initial_learning_rate, bool)
            or not isinstance(initial_learning_rate, numbers.Real)
            or initial_learning_rate < 0
        ):
            raise ValueError(
                f"initial_learning_rate must be a number >= 0; got {initial_learning_rate!r}"
            )
        self.after = after
        self.warmup_steps = int(warmup_steps)
        self.initial_learning_rate = float(initial_learning_rate)
        self.name = name
        if say:
            target = "its schedule" if self._is_schedule else f"{float(after):g}"
            chief.say_once(
                f"warmup-{self.warmup_steps}-{self.initial_learning_rate}-{target}",
                f"learning rate warm-up over {self.warmup_steps} steps from "
                f"{self.initial_learning_rate:g} to {target}",
            )

    @property
    def _is_schedule(self) -> bool:
        return isinstance(self.after, keras.optimizers.schedules.LearningRateSchedule)

    def __call__(self, step: Any) -> Any:
        """The learning rate at optimizer step `step`."""
        ops = keras.ops
        step = ops.cast(step, "float32")
        target = self.after(step) if self._is_schedule else self.after
        target = ops.cast(target, "float32")
        fraction = ops.minimum(step / float(self.warmup_steps), 1.0)
        start = self.initial_learning_rate
        return start + (target - start) * fraction

    def get_config(self) -> dict[str, Any]:
        """The schedule's arguments; the schedule it follows is serialised too."""
        after = (
            keras.optimizers.schedules.serialize(self.after)
            if self._is_schedule
            else float(self.after)
        )
        return {
            "after": after,
            "warmup_steps": self.warmup_steps,
            "initial_learning_rate": self.initial_learning_rate,
            "name": self.name,
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> WarmUp:
        """Rebuilds the schedule from `get_config`, without saying it again."""
        return cls(**config, say=False)


def _warmup_steps(epochs, steps, steps_per_epoch) -> int | None:
    if epochs is not None and steps is not None:
        raise ValueError(
            f"give warmup_epochs or warmup_steps, not both (got {epochs!r} and {steps!r})"
        )
    if steps is not None:
        _check_positive("warmup_steps", steps)
        if steps_per_epoch is not None:
            _check_positive("steps_per_epoch", steps_per_epoch)
        return int(steps)
    if epochs is None:
        if steps_per_epoch is not None:
            raise ValueError(
                "steps_per_epoch only matters with warmup_epochs; pass warmup_epochs=... "
                "or drop steps_per_epoch"
            )
        return None
    _check_positive("warmup_epochs", epochs, number=True)
    if steps_per_epoch is None:
        raise ValueError(
            f"warmup_epochs={epochs!r} needs steps_per_epoch (a schedule counts optimizer "
            "steps): pass steps_per_epoch=len(dataset), or warmup_steps=... instead"
        )
    _check_positive("steps_per_epoch", steps_per_epoch)
    return max(1, round(epochs * steps_per_epoch))


def _check_positive(label: str, value: Any, number: bool = False) -> None:
    if number:
        positive_number(value, label)
    else:
        positive_int(value, label)
