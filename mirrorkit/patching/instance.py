"""Patches of one object: an attribute of one model, optimizer, callback or strategy.

Where a part of mirrorkit changes what one Keras or TensorFlow object does (`NaNGuard`
records each replica's loss through the model's ``_compute_loss``, the step hooks put
their chain in ``model.train_function``, ``mk.resumable`` records its progress around the
callback's own hooks), it goes through this module, which remembers what was there:
`set_on` puts a value in place (a train function, a strategy's options), and `wrap` puts a
function around a method, calling what is below it when it is called: the object's own
value, or its class's method as it is then (with the class-wide repairs in place then), never
a method read once and kept. Several `wrap` patches of one attribute compose by their declared
place, whatever order they came in. ``mirrorkit.compat.describe()`` lists the ones in place
beside the process-wide repairs, and ``mirrorkit.compat.disable()`` puts every original back
(`remove_all`).

An object holds its own patches, in the one attribute mirrorkit adds to it
(``_mirrorkit_patches``, gone with its last patch), and this module lists them weakly: a
patch's original (a model's train function) refers to the object, so a patch held anywhere
else would keep the object alive; held by the object, it goes with it.

Example:
```python
import keras
from mirrorkit.patching import instance

model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
patch = instance.set_on(
    model, "train_step", lambda data: {}, name="example.step", reason="an example"
)
print([p.name for p in instance.in_place()])  # ['example.step']
instance.restore(patch)
print("train_step" in vars(model))  # False: the class's method again

def louder(below):
    return lambda *args, **kwargs: below(*args, **kwargs)

instance.wrap(model, "summary", louder, name="example.summary", reason="an example")
instance.restore_on(model, "summary")
```
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable
from typing import Any

#: Stands for "the object had no attribute of its own" (it read its class's).
_ABSENT = object()


@dataclasses.dataclass(eq=False)
class InstancePatch:
    """One attribute of one object that mirrorkit replaced.

    Attributes:
        name: short name, e.g. ``nan_guard.compute_loss``.
        reason: the part of mirrorkit that needs it, and what for.
        attribute: the attribute's name on the object.
        owner: a weak reference to the object.
        original: what the object held before (`_ABSENT`: nothing of its own).
        installed: what mirrorkit put there.
        on_removed: called with the object after `remove_all` puts the original back, so
            the part of mirrorkit that made the patch forgets it (its hook chain, say).
        place: for a `wrap` patch, where it goes among the wrap patches of the same attribute
            (the lowest wraps what the object had, the highest is what is called).
        wrapper: for a `wrap` patch, what makes its function from the one below it.
    """

    name: str
    reason: str
    attribute: str
    owner: weakref.ref
    original: Any
    installed: Any
    on_removed: Callable[[Any], None] | None = None
    place: int = 0
    wrapper: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None

    @property
    def target(self) -> str:
        """``module.Class.attribute of <object>``, the object by its Keras name if it has one."""
        obj = self.owner()
        if obj is None:
            return f"{self.attribute} of an object that is gone"
        kind = type(obj)
        label = getattr(obj, "name", None)
        which = f"'{label}'" if isinstance(label, str) else f"at 0x{id(obj):x}"
        return f"{kind.__module__}.{kind.__qualname__}.{self.attribute} of the instance {which}"

    @property
    def in_place(self) -> bool:
        """Whether the object still holds what mirrorkit put there."""
        obj = self.owner()
        return obj is not None and vars(obj).get(self.attribute, _ABSENT) is self.installed


#: The attribute of a patched object that holds its patches, by attribute name.
HELD = "_mirrorkit_patches"

#: The patches made, in the order they were made, held weakly (their objects hold them).
_MADE: list[weakref.ref] = []


def set_on(
    obj: Any,
    attribute: str,
    value: Any,
    *,
    name: str,
    reason: str,
    on_removed: Callable[[Any], None] | None = None,
) -> InstancePatch:
    """Sets ``obj.attribute = value`` as a declared patch, remembering the original.

    Setting it again keeps the first original (and `on_removed`, unless given anew), unless
    Keras replaced the attribute in between (a new train function after a re-trace): then
    what Keras put there is the original.

    Args:
        obj: the Keras or TensorFlow object (held weakly).
        attribute: the attribute's name.
        value: what mirrorkit puts there.
        name: the patch's short name (``compat.describe`` lists it).
        reason: the part of mirrorkit that needs it, and what for.
        on_removed: called with `obj` after `remove_all` takes the patch off.

    Returns:
        The patch, for `restore`.
    """
    found = _find(obj, attribute)
    if found is not None and found.in_place and found.wrapper is not None:
        raise ValueError(
            f"{found.target} is wrapped ({found.name}): a value cannot replace it; "
            "restore the wrap patches first (instance.restore_on)"
        )
    if found is not None and found.in_place:
        original = found.original
        on_removed = on_removed or found.on_removed
    else:
        original = vars(obj).get(attribute, _ABSENT)
    setattr(obj, attribute, value)
    patch = InstancePatch(name, reason, attribute, weakref.ref(obj), original, value, on_removed)
    # Beside the object's own attributes, not through its __setattr__ (Keras tracks those).
    vars(obj).setdefault(HELD, {})[attribute] = [patch]
    _MADE[:] = [ref for ref in _MADE if ref() is not None and ref() is not found]
    _MADE.append(weakref.ref(patch))
    return patch


def wrap(
    obj: Any,
    attribute: str,
    wrapper: Callable[[Callable[..., Any]], Callable[..., Any]],
    *,
    name: str,
    reason: str,
    place: int = 0,
    on_removed: Callable[[Any], None] | None = None,
) -> InstancePatch:
    """Puts ``wrapper(below)`` on ``obj.attribute``, `below` calling what is under it.

    `below` calls, when it is called, the wrap patches of lower place, then the object's own
    value if it had one, else its class's method as the class holds it then (the class-wide
    repairs of it included, whenever they were applied). Wrapping again under the same name
    replaces that patch; two wrap patches of one attribute must declare different places.

    Args:
        obj: the Keras or TensorFlow object (held weakly).
        attribute: the method's name.
        wrapper: makes the function from the one below it.
        name: the patch's short name (``compat.describe`` lists it).
        reason: the part of mirrorkit that needs it, and what for.
        place: where it goes among this attribute's wrap patches (the highest is called).
        on_removed: called with `obj` after `remove_all` takes the patch off.

    Returns:
        The patch, for `restore`.

    Raises:
        ValueError: a value (`set_on`) replaces the attribute, or another wrap patch of it
            declares the same place.
    """
    layers = list(vars(obj).get(HELD, {}).get(attribute, []))
    if layers and not layers[-1].in_place:  # Keras set the attribute anew: it is below now
        layers = []
    if layers and layers[-1].wrapper is None:
        raise ValueError(
            f"{layers[-1].target} holds a value ({layers[-1].name}): it cannot be wrapped"
        )
    layers = [layer for layer in layers if layer.name != name]
    taken = [layer.name for layer in layers if layer.place == place]
    if taken:
        raise ValueError(
            f"{name} and {taken[0]} wrap {attribute} at the same place {place}: give each "
            "its own place, so that their order is declared"
        )
    original = layers[0].original if layers else vars(obj).get(attribute, _ABSENT)
    patch = InstancePatch(
        name, reason, attribute, weakref.ref(obj), original, None, on_removed, place, wrapper
    )
    _compose(obj, attribute, sorted([*layers, patch], key=lambda layer: layer.place))
    _MADE.append(weakref.ref(patch))
    return patch


def _compose(obj: Any, attribute: str, layers: list[InstancePatch]) -> None:
    """Puts `layers` (wrap patches, by place) on ``obj.attribute``, over what was below."""
    original = layers[0].original
    if original is _ABSENT:
        below = _class_method(weakref.ref(obj), attribute)
    else:
        below = original
    for layer in layers:
        below = layer.wrapper(below)
    setattr(obj, attribute, below)
    for layer in layers:
        layer.installed = below
    vars(obj).setdefault(HELD, {})[attribute] = layers


def _class_method(ref: weakref.ref, attribute: str) -> Callable[..., Any]:
    """Calls the class's `attribute` as the class holds it when called, bound to the object."""

    def below(*args: Any, **kwargs: Any) -> Any:
        obj = ref()
        method = getattr(type(obj), attribute)
        return method.__get__(obj, type(obj))(*args, **kwargs)

    below.__name__ = attribute
    return below


def restore(patch: InstancePatch | None) -> None:
    """Puts back what `patch` replaced, if the object still holds mirrorkit's value.

    A patch already restored, or whose attribute Keras set anew since, is only forgotten.

    Args:
        patch: what `set_on` returned (None: nothing to do).
    """
    obj = None if patch is None else patch.owner()
    layers = [] if obj is None else vars(obj).get(HELD, {}).get(patch.attribute, [])
    if not any(layer is patch for layer in layers):
        return
    held = vars(obj)[HELD]
    rest = [layer for layer in layers if layer is not patch]
    if rest and patch.in_place:  # the other wrap patches stay, composed by place as before
        _compose(obj, patch.attribute, rest)
        return
    del held[patch.attribute]
    if not held:
        del vars(obj)[HELD]
    if not patch.in_place:  # Keras set the attribute anew: its value stays
        return
    if patch.original is _ABSENT:
        delattr(obj, patch.attribute)
    else:
        setattr(obj, patch.attribute, patch.original)


def restore_on(obj: Any, attribute: str) -> None:
    """`restore` for the patches of ``obj.attribute`` (every wrap patch of it), if any.

    Args:
        obj: the object.
        attribute: the attribute's name.
    """
    for patch in reversed(list(vars(obj).get(HELD, {}).get(attribute, []))):
        restore(patch)


def patched(obj: Any, attribute: str) -> InstancePatch | None:
    """The patch of ``obj.attribute`` in place now, or None.

    Args:
        obj: the object.
        attribute: the attribute's name.
    """
    found = _find(obj, attribute)
    return found if found is not None and found.in_place else None


def in_place() -> list[InstancePatch]:
    """The patches in place now, in the order they were made."""
    live = [ref() for ref in _MADE]
    _MADE[:] = [ref for ref, patch in zip(_MADE, live, strict=True) if patch is not None]
    return [patch for patch in live if patch is not None and patch.in_place]


def remove_all() -> None:
    """Puts every original back, the last patch made first."""
    for patch in reversed([ref() for ref in _MADE]):
        obj = None if patch is None else patch.owner()
        if obj is None:
            continue
        was_in_place = patch.in_place
        restore(patch)  # forgets a patch Keras replaced since, too
        if was_in_place and patch.on_removed is not None:
            patch.on_removed(obj)
    _MADE.clear()


def _find(obj: Any, attribute: str) -> InstancePatch | None:
    """The top patch of ``obj.attribute`` (what is called), or None."""
    layers = vars(obj).get(HELD, {}).get(attribute)
    return layers[-1] if layers else None
