"""Patches of one object: an attribute of one model, optimizer, callback or strategy.

Where a part of mirrorkit changes what one Keras or TensorFlow object does (`NaNGuard`
records each replica's loss through the model's ``_compute_loss``, the step hooks put
their chain in ``model.train_function``, ``mk.resumable`` writes its backup through the
callback's ``_save_model``), it sets the attribute through `set_on`, which remembers what
was there. ``mirrorkit.compat.describe()`` lists the ones in place beside the
process-wide repairs, and ``mirrorkit.compat.disable()`` puts every original back
(`remove_all`). An object that is gone takes its patches with it: they are held weakly.

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


#: The patches made, in the order they were made (stale ones are dropped as they are met).
_MADE: list[InstancePatch] = []


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
    if found is not None:
        _MADE.remove(found)
    setattr(obj, attribute, value)
    patch = InstancePatch(name, reason, attribute, weakref.ref(obj), original, value, on_removed)
    _MADE.append(patch)
    return patch


def restore(patch: InstancePatch | None) -> None:
    """Puts back what `patch` replaced, if the object still holds mirrorkit's value.

    A patch already restored, or whose attribute Keras set anew since, is only forgotten.

    Args:
        patch: what `set_on` returned (None: nothing to do).
    """
    if patch is None or patch not in _MADE:
        return
    _MADE.remove(patch)
    obj = patch.owner()
    if obj is None or not patch.in_place:
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
    _MADE[:] = [p for p in _MADE if p.in_place]
    return list(_MADE)


def remove_all() -> None:
    """Puts every original back, the last patch made first."""
    for patch in reversed(in_place()):
        obj = patch.owner()
        restore(patch)
        if patch.on_removed is not None and obj is not None:
            patch.on_removed(obj)
    _MADE.clear()


def _find(obj: Any, attribute: str) -> InstancePatch | None:
    for patch in _MADE:
        if patch.owner() is obj and patch.attribute == attribute:
            return patch
    return None
