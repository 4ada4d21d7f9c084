"""One ordered chain of hooks around the optimizer's gradient all-reduce.

Keras's TensorFlow optimizer sums each replica's gradients in one method,
``_all_reduce_sum_gradients`` (a private internal, reached only through
`mirrorkit.internals`). Three parts of mirrorkit act there: gradient
compression (`mk.build(gradient_compression=)`), `NaNGuard`'s per-replica check
and `ThroughputCallback`'s per-worker step clock. This module is the one place
that replaces the method: once per optimizer, with a chain that runs the
registered hooks in an order fixed by stage, never by the order they were
registered in (in the spirit of PyTorch DDP's ``register_comm_hook``):

1. ``"before"``: each replica's own gradients, before any collective. A hook
   may change them, or add a *rider*: a tensor summed in the same all-reduce
   as the gradients (no extra collective).
2. ``"reduce"``: the all-reduce itself, Keras's own unless ONE hook replaces
   it (compression casts to 16 bits, all-reduces, casts back). As with DDP's
   single comm hook, a second hook that replaces the all-reduce is an error:
   remove the first one before registering another.
3. ``"after"``: the summed gradients and riders, the same on every replica.

Within a stage, hooks run by ``order``, then by name. mirrorkit's own hooks
take their places from `PLACES`. A hook is known by its name on an optimizer:
registering the same name again replaces the earlier hook (so the same hook
registered twice is one hook). Removing the last hook puts the optimizer's own
method back. A step traced before a change keeps the hooks it was traced with:
set ``model.train_function = None`` after registering or removing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from mirrorkit import internals
from mirrorkit.patching import instance
from mirrorkit.training import hook_places

#: The private Keras method the chain replaces, and how errors name it.
ALL_REDUCE = "_all_reduce_sum_gradients"
NAME = f"keras optimizer.{ALL_REDUCE}"

#: The stages, in the order they run.
STAGES = ("before", "reduce", "after")

#: mirrorkit's own hooks: name -> (stage, order within the stage).
PLACES = {
    # This replica's gradients are ready: its own work, timed before mirrorkit adds any.
    "step_clock": ("before", 10),
    # Non-finite local loss or gradients, flagged; the flags ride in the all-reduce.
    "nan_guard.check": ("before", 20),
    # float32 gradients sent as float16/bfloat16 (riders too), received as float32.
    "compression": ("reduce", 0),
    # Every replica's flags, summed: the same verdict on every replica.
    "nan_guard.verdict": ("after", 10),
    # This replica's all-reduce is over: its wait for the others and the transfer, timed.
    "step_clock.reduced": ("after", 0),
}

#: What `ran` lists for Keras's own all-reduce when no hook replaces it.
KERAS_REDUCE = "keras all-reduce"


@dataclasses.dataclass
class Gradients:
    """What a ``"before"`` or ``"after"`` hook sees, and may change, in one replica's step.

    Attributes:
        grads_and_vars: the (gradient, variable) pairs: this replica's own
            before the all-reduce, the sums after it.
        riders: extra tensors summed in the same all-reduce, by the name of the
            hook that added them: this replica's own before, the sums after.
        reduced: whether the all-reduce has run.
    """

    grads_and_vars: list[tuple[Any, Any]]
    riders: dict[str, Any] = dataclasses.field(default_factory=dict)
    reduced: bool = False


@dataclasses.dataclass(frozen=True)
class GradientHook(hook_places.PlacedHook):
    """One hook in the chain.

    Args:
        name: the hook's name on the optimizer (one hook per name).
        fn: for ``"before"`` and ``"after"``, ``fn(gradients)`` with a
            `Gradients` to read or change in place; for ``"reduce"``,
            ``fn(grads_and_vars, all_reduce)`` returning the summed pairs,
            where ``all_reduce`` is Keras's own.
        stage: ``"before"``, ``"reduce"`` or ``"after"``; None for mirrorkit's
            own hooks, which take theirs from `PLACES`.
        order: the place within the stage (lower runs first; ties by name).

    Raises:
        ValueError: an unknown stage, or a name not in `PLACES` without one.
        TypeError: `fn` is not callable.
    """

    KIND = "gradient hook"
    PLACES = PLACES
    STAGES = STAGES


class _Chain:
    """What the optimizer's all-reduce method is while any hook is registered."""

    def __init__(self, keras_all_reduce: Callable):
        self.keras_all_reduce = keras_all_reduce  # the method the chain stands in for
        self.hooks: dict[str, GradientHook] = {}
        self.last_run: tuple[str, ...] = ()

    def ordered(self) -> tuple[GradientHook, ...]:
        return tuple(
            sorted(self.hooks.values(), key=lambda h: (STAGES.index(h.stage), h.order, h.name))
        )

    def __call__(self, grads_and_vars):
        hooks = self.ordered()
        ran = []
        step = Gradients(list(grads_and_vars))
        for hook in hooks:
            if hook.stage == "before":
                hook.fn(step)
                ran.append(hook.name)
        count, names = len(step.grads_and_vars), list(step.riders)
        pairs = step.grads_and_vars + [(step.riders[name], None) for name in names]
        (reducer,) = [h for h in hooks if h.stage == "reduce"] or [None]
        if reducer is None:
            summed = list(self.keras_all_reduce(pairs))
            ran.append(KERAS_REDUCE)
        else:
            summed = list(reducer.fn(pairs, self.keras_all_reduce))
            ran.append(reducer.name)
        step.grads_and_vars = summed[:count]
        step.riders = {name: g for name, (g, _) in zip(names, summed[count:], strict=True)}
        step.reduced = True
        for hook in hooks:
            if hook.stage == "after":
                hook.fn(step)
                ran.append(hook.name)
        self.last_run = tuple(ran)  # set once, at the end: replicas' traces interleave
        return step.grads_and_vars


def _chain(optimizer: Any) -> _Chain | None:
    found = vars(optimizer).get(ALL_REDUCE)
    return found if isinstance(found, _Chain) else None


def require(optimizer: Any, *, used_for: str) -> None:
    """Raises `InternalChangedError` unless the optimizer has the all-reduce the chain wraps.

    Args:
        optimizer: the optimizer that all-reduces (see `innermost_optimizer`).
        used_for: the feature that needs it, named in the error.

    Raises:
        InternalChangedError: the Keras optimizer has no ``_all_reduce_sum_gradients``.
    """
    internals.require(optimizer, ALL_REDUCE, name=NAME, used_for=used_for)


def register(optimizer: Any, hook: GradientHook, *, used_for: str) -> None:
    """Adds `hook` to the optimizer's chain, putting the chain in place the first time.

    Args:
        optimizer: the optimizer that all-reduces (see `innermost_optimizer`).
        hook: the hook; one of the same name is replaced.
        used_for: the feature the hook serves, named if the internal is missing.

    Raises:
        InternalChangedError: the optimizer has no ``_all_reduce_sum_gradients``.
        ValueError: `hook` replaces the all-reduce and another hook already does.
        TypeError: `hook` is not a `GradientHook`.

    Example:
    ```python
    import keras
    import mirrorkit as mk
    from mirrorkit.training import gradient_hooks

    def make_model():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        return model

    model = mk.build(make_model, mk.strategy(cpu_replicas=2), gradient_compression="fp16")
    seen = []
    hook = gradient_hooks.GradientHook(
        "count", lambda step: seen.append(len(step.grads_and_vars)), stage="before"
    )
    gradient_hooks.register(model.optimizer, hook, used_for="counting gradients")
    model.fit(keras.random.normal((64, 4)), keras.random.normal((64, 1)), verbose=0)
    print([h.name for h in gradient_hooks.hooks(model.optimizer)])  # ['count', 'compression']
    print(gradient_hooks.ran(model.optimizer))  # ('count', 'compression')
    gradient_hooks.remove(model.optimizer, hook)
    ```
    """
    if not isinstance(hook, GradientHook):
        raise TypeError(
            "register takes a GradientHook, e.g. GradientHook('name', fn, stage='before'); "
            f"got {type(hook).__name__} {hook!r}"
        )
    chain = _chain(optimizer)
    if hook.stage == "reduce" and chain is not None:
        taken = [h for h in chain.hooks.values() if h.stage == "reduce" and h.name != hook.name]
        if taken:
            raise ValueError(
                f"gradient hook {hook.name!r} replaces the all-reduce, but {taken[0].name!r} "
                "already replaces it on this optimizer: only one hook may (as DDP takes one "
                f"comm hook). Remove it first: gradient_hooks.remove(optimizer, "
                f"{taken[0].name!r})."
            )
    if chain is None:
        internals.require(optimizer, ALL_REDUCE, name=NAME, used_for=used_for)
        chain = _Chain(getattr(optimizer, ALL_REDUCE))
        instance.set_on(
            optimizer,
            ALL_REDUCE,
            chain,
            name="gradient_hooks.all_reduce",
            reason="mirrorkit's gradient hooks (clipping after the all-reduce, sparse averaging, "
            "NaNGuard's gradient check, compression, the replica timing) run around this "
            "optimizer's all-reduce",
        )
    chain.hooks[hook.name] = hook


def remove(optimizer: Any, hook: GradientHook | str) -> None:
    """Takes a hook out; the optimizer's own method is back when none is left.

    Args:
        optimizer: the optimizer the hook was registered on.
        hook: the hook, or its name. A hook that a later one of the same name
            replaced is not there any more: removing it leaves the later one.
    """
    chain = _chain(optimizer)
    name = hook if isinstance(hook, str) else hook.name
    if chain is None or name not in chain.hooks:
        return
    if not isinstance(hook, str) and chain.hooks[name] != hook:
        return
    del chain.hooks[name]
    if not chain.hooks:
        instance.restore_on(optimizer, ALL_REDUCE)


def hooks(optimizer: Any) -> tuple[GradientHook, ...]:
    """The optimizer's hooks in the order they run (empty: the method is Keras's own).

    Args:
        optimizer: any Keras optimizer.

    Returns:
        The registered hooks, by stage, then order, then name.
    """
    chain = _chain(optimizer)
    return chain.ordered() if chain is not None else ()


def ran(optimizer: Any) -> tuple[str, ...]:
    """The hook names in the order the last traced (or eager) all-reduce ran them.

    The all-reduce itself is listed as the name of the hook that replaced it,
    or `KERAS_REDUCE`. Empty when no hook is registered or none has run yet.

    Args:
        optimizer: any Keras optimizer.

    Returns:
        Names, in the order they ran.
    """
    chain = _chain(optimizer)
    return chain.last_run if chain is not None else ()


def innermost_optimizer(model: Any) -> Any:
    """The optimizer that all-reduces gradients (inside a LossScaleOptimizer, if any).

    Args:
        model: a Keras model, compiled or not.

    Returns:
        The optimizer, or None for a model without one.
    """
    optimizer = getattr(model, "optimizer", None)
    while optimizer is not None and hasattr(optimizer, "inner_optimizer"):
        optimizer = optimizer.inner_optimizer
    return optimizer
