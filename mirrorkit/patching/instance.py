"""Patches of one object: an attribute of one model, optimizer, callback or strategy.

Where a part of mirrorkit changes what one Keras or TensorFlow object does (`NaNGuard`
records each replica's loss through the model's ``_compute_loss``, the step hooks put
their chain in ``model.train_function``, ``mk.resumable`` writes its backup through the
callback's ``_save_model``), it sets the attribute through `set_on`, which remembers what
was there. ``mirrorkit.compat.describe()`` lists the ones in place beside the
process-wide repairs, and ``mirrorkit.compat.disable()`` puts every original back
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
    """

    name: str
    reason: str
    attribute: str
    owner: weakref.ref
    original: Any
    installed: Any
    on_removed: Callable[[Any], None] | None = None

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
    if found is not None and found.in_place:
        original = found.original
        on_removed = on_removed or found.on_removed
    else:
        original = vars(obj).get(attribute, _ABSENT)
    setattr(obj, attribute, value)
    patch = InstancePatch(name, reason, attribute, weakref.ref(obj), original, value, on_removed)
    # Beside the object's own attributes, not through its __setattr__ (Keras tracks those).
    vars(obj).setdefault(HELD, {})[attribute] = patch
    _MADE[:] = [ref for ref in _MADE if ref() is not None and ref() is not found]
    _MADE.append(weakref.ref(patch))
    return patch


def restore(patch: InstancePatch | None) -> None:
    """Puts back what `patch` replaced, if the object still holds mirrorkit's value.

    A patch already restored, or whose attribute Keras set anew since, is only forgotten.

    Args:
        patch: what `set_on` returned (None: nothing to do).
    """
    obj = None if patch is None else patch.owner()
    if obj is None or _find(obj, patch.attribute) is not patch:
        return
    held = vars(obj)[HELD]
    del held[patch.attribute]
    if not held:
        del vars(obj)[HELD]
    if not patch.in_place:
        return
    if patch.original is _ABSENT:
        delattr(obj, patch.attribute)
    else:
        setattr(obj, patch.attribute, patch.original)


def restore_on(obj: Any, attribute: str) -> None:
    """`restore` for the patch of ``obj.attribute``, if there is one.

    Args:
        obj: the object.
        attribute: the attribute's name.
    """
    restore(_find(obj, attribute))


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
    return vars(obj).get(HELD, {}).get(attribute)
