"""One ordered chain of hooks around a model's training step, kept across re-traces.

The counterpart of `gradient_hooks` for the whole step. Keras's ``fit`` calls
``model.train_function(iterator)`` once a step (once per group of
``steps_per_execution``), and ``model.train_step(data)`` is what that function
traces. Several parts of mirrorkit act there: `ThroughputCallback` times each
call, its step clock times each replica's work inside the trace, and `NaNGuard`
raises after a step that was not finite. (A resumed epoch's first batches are
dropped before any step, by `mirrorkit.feeding.input_position`.) This module is the one place that
replaces ``model.train_function`` and ``model.train_step``: once per model,
with a chain that runs the registered hooks in an order fixed by stage and
place, never by the order callbacks were listed or registered in.

Two stages:

1. ``"call"``: around each call of Keras's compiled train function, on the
   host. ``fn(call_next, iterator)`` returns the logs; the hook with the lowest
   ``order`` is the outermost. A hook may skip the step (not call
   ``call_next``).
2. ``"traced"``: around ``model.train_step``, inside the trace:
   ``fn(call_next, data)`` returns the step's logs.

When Keras traces the step again (``make_train_function(force=True)``, a
``compile``, a second ``fit``), the new function is put back into the chain
(`wrap`, called by the ``step_chain`` entry of `mirrorkit.compat`), so no
hook is dropped by a re-trace. Registering or removing a ``"traced"`` hook
needs a new trace: the chain asks for one (``model.train_function = None``,
traced again at the next ``fit``; inside a ``fit``, `retrace` traces at once).
Removing the last hook puts Keras's own function and method back.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable
from typing import Any

from mirrorkit.patching import instance
from mirrorkit.training import hook_places

#: The stages, outermost first.
STAGES = ("call", "traced")

#: mirrorkit's own hooks: name -> (stage, order; lower is further out).
PLACES = {
    # The step as ThroughputCallback's report counts it: what is outside is host work. The
    # guards' per-step read-back is inside, so adding NaNGuard does not move the verdict (its
    # cost is the guard's own: benchmarks/guards_cost.py).
    "throughput.timer": ("call", 20),
    # After a step whose loss or gradients were not finite: raise, on every worker.
    "nan_guard.verdict": ("call", 30),
    # Each replica's own work inside the trace, from its batch to its gradients.
    "step_clock": ("traced", 10),
}


@dataclasses.dataclass(frozen=True)
class StepHook(hook_places.PlacedHook):
    """One hook in a model's step chain.

    Args:
        name: the hook's name on the model (one hook per name).
        fn: ``fn(call_next, iterator)`` for ``"call"``, ``fn(call_next, data)``
            for ``"traced"``; returns what ``call_next`` returns (the logs).
        stage: ``"call"`` or ``"traced"``; None for mirrorkit's own hooks,
            which take theirs from `PLACES`.
        order: the place within the stage (lower is further out; ties by name).

    Raises:
        ValueError: an unknown stage, or a name not in `PLACES` without one.
        TypeError: `fn` is not callable.
    """

    KIND = "step hook"
    PLACES = PLACES
    STAGES = STAGES


class _Chain:
    """A model's hooks, and what the chain stands in for."""

    def __init__(self):
        self.hooks: dict[str, StepHook] = {}
        self.traced_in_place = False

    def ordered(self, stage: str) -> list[StepHook]:
        return sorted(
            (h for h in self.hooks.values() if h.stage == stage), key=lambda h: (h.order, h.name)
        )


class _ChainedCall:
    """What ``model.train_function`` is while the model has ``"call"`` hooks."""

    def __init__(self, chain: _Chain, compiled: Callable):
        self.chain = chain
        self.compiled = compiled  # Keras's own train function, as it traced it

    def __call__(self, *args, **kwargs):
        call = self.compiled
        for hook in reversed(self.chain.ordered("call")):  # innermost first
            call = _bind(hook.fn, call)
        return call(*args, **kwargs)


def _bind(fn: Callable, call_next: Callable) -> Callable:
    return lambda *args, **kwargs: fn(call_next, *args, **kwargs)


_CHAINS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

#: Why the model's train function and step are replaced (what ``compat.describe`` says).
_REASON = (
    "mirrorkit's step hooks (ThroughputCallback's timer and step clock, NaNGuard's verdict) "
    "run around this model's step"
)


def _forget(model: Any) -> None:
    """After ``compat.disable()`` put Keras's function back: the model has no chain."""
    _CHAINS.pop(model, None)


def register(model: Any, hook: StepHook) -> None:
    """Adds `hook` to the model's step chain (one of the same name is replaced).

    A ``"call"`` hook acts from the next call of the train function on, the
    one already traced included; a ``"traced"`` hook from the next trace.

    Args:
        model: a Keras model.
        hook: the hook.

    Raises:
        TypeError: `hook` is not a `StepHook`.

    Example:
    ```python
    import keras
    import numpy as np
    from mirrorkit.training import step_hooks

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    calls = []

    def count(call_next, iterator):
        calls.append(1)
        return call_next(iterator)

    hook = step_hooks.StepHook("count", count, stage="call")
    step_hooks.register(model, hook)
    model.fit(np.ones((64, 4)), np.ones((64, 1)), batch_size=16, verbose=0)
    print(len(calls), [h.name for h in step_hooks.hooks(model)])  # 4 ['count']
    step_hooks.remove(model, hook)
    ```
    """
    if not isinstance(hook, StepHook):
        raise TypeError(
            "register takes a StepHook, e.g. StepHook('name', fn, stage='call'); "
            f"got {type(hook).__name__} {hook!r}"
        )
    # The patch that puts a function Keras traces again back into the chain: applied with
    # the first hook (idempotent).
    from mirrorkit.training import step_chain  # it imports this module: not at the top

    step_chain.REPAIR.apply()
    chain = _CHAINS.get(model)
    if chain is None:
        chain = _CHAINS[model] = _Chain()
    previous = chain.hooks.get(hook.name)
    chain.hooks[hook.name] = hook
    if hook.stage == "traced" or (previous is not None and previous.stage == "traced"):
        _put_traced_in_place(model, chain)
    wrap(model)


def remove(model: Any, hook: StepHook | str) -> None:
    """Takes a hook out; Keras's own function and method are back when none is left.

    Args:
        model: the model the hook was registered on.
        hook: the hook, or its name. A hook that a later one of the same name
            replaced is not there any more: removing it leaves the later one.
    """
    chain = _CHAINS.get(model)
    name = hook if isinstance(hook, str) else hook.name
    if chain is None or name not in chain.hooks:
        return
    if not isinstance(hook, str) and chain.hooks[name] != hook:
        return
    removed = chain.hooks.pop(name)
    if removed.stage == "traced" and not chain.ordered("traced"):
        _take_traced_out(model, chain)
    if not chain.hooks:
        del _CHAINS[model]
    _unwrap_or_wrap(model)


def hooks(model: Any) -> tuple[StepHook, ...]:
    """The model's hooks in the order they run: ``"call"`` outermost first, then ``"traced"``.

    Args:
        model: a Keras model.

    Returns:
        The registered hooks (empty: the step is Keras's own).
    """
    chain = _CHAINS.get(model)
    if chain is None:
        return ()
    return tuple(chain.ordered("call") + chain.ordered("traced"))


def wrap(model: Any) -> bool:
    """Puts the model's current train function inside its chain; True if it did.

    Called after Keras makes a train function (``make_train_function``), and by
    `register`. A function already in the chain, a model without ``"call"``
    hooks, and a model without a train function yet are left as they are.

    Args:
        model: a Keras model.
    """
    chain = _CHAINS.get(model)
    current = getattr(model, "train_function", None)
    if chain is None or not chain.ordered("call") or current is None:
        return False
    if isinstance(current, _ChainedCall):
        if current.chain is chain:
            return False
        current = current.compiled
    instance.set_on(
        model,
        "train_function",
        _ChainedCall(chain, current),
        name="step_hooks.train_function",
        reason=_REASON,
        on_removed=_forget,
    )
    return True


def retrace(model: Any) -> None:
    """Traces the model's train step again now, and puts it in the chain.

    For a hook that changes what is traced (a ``"traced"`` hook, a replaced
    ``_compute_loss``) after ``fit`` made its train function, i.e. in
    ``on_train_begin``.

    Args:
        model: a compiled Keras model.
    """
    model.make_train_function(force=True)
    wrap(model)


def compiled(model: Any) -> Any:
    """Keras's own train function under the chain (or the function itself, unchained).

    Args:
        model: a Keras model.
    """
    current = getattr(model, "train_function", None)
    return current.compiled if isinstance(current, _ChainedCall) else current


def _unwrap_or_wrap(model: Any) -> None:
    chain = _CHAINS.get(model)
    current = getattr(model, "train_function", None)
    if isinstance(current, _ChainedCall) and (chain is None or not chain.ordered("call")):
        instance.restore_on(model, "train_function")
        if isinstance(getattr(model, "train_function", None), _ChainedCall):  # not the patch's
            model.train_function = current.compiled


def _put_traced_in_place(model: Any, chain: _Chain) -> None:
    """``model.train_step`` becomes the traced stage; the next trace takes it in."""
    if not chain.traced_in_place:
        own_step = model.train_step  # the class's method, or a wrapper set before the chain

        def chained_train_step(*args, **kwargs):
            call = own_step
            for hook in reversed(chain.ordered("traced")):
                call = _bind(hook.fn, call)
            return call(*args, **kwargs)

        instance.set_on(
            model,
            "train_step",
            chained_train_step,
            name="step_hooks.train_step",
            reason=_REASON,
            on_removed=_forget,
        )
        chain.traced_in_place = True
    model.train_function = None  # traced again, with the traced stage, at the next fit


def _take_traced_out(model: Any, chain: _Chain) -> None:
    if not chain.traced_in_place:
        return
    instance.restore_on(model, "train_step")
    chain.traced_in_place = False
    model.train_function = None  # the traced step holds the hooks; traced again next fit
