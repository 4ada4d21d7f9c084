"""What mirrorkit remembers about a Keras or TensorFlow object, kept beside it, not on it.

mirrorkit needs a little state per object: whether a strategy's per-step logs are the
worker's own, the compiled all-reduce a strategy's stop flags go through, which epoch a
``fit``'s callbacks already began. It lives here, keyed weakly by the object, so no Keras or
TensorFlow object carries an attribute of mirrorkit's, and the state goes when the object
does. A value must not refer to its object, or it keeps the object alive (the mapping holds
values strongly); the one that does, ``agreed_stop``'s compiled all-reduce of a
``MultiWorkerMirroredStrategy``, keeps a strategy that lives for the process anyway. A patch,
which refers to its object through the original it replaced, is held by the object instead
(`mirrorkit.patching.instance`).

Example:
```python
import keras
from mirrorkit.patching import attached

callbacks = keras.callbacks.CallbackList()
attached.attach(callbacks, "example.seen", True)
print(attached.attached(callbacks, "example.seen"), vars(callbacks).get("example.seen"))
# True None
```
"""

from __future__ import annotations

import weakref
from typing import Any

#: id(object) -> (a weak reference that forgets the entry when the object goes, its state).
_STATE: dict[int, tuple[weakref.ref, dict[str, Any]]] = {}


def attach(obj: Any, key: str, value: Any) -> None:
    """Remembers `value` under `key` for `obj` (replacing what was there).

    Args:
        obj: a Keras or TensorFlow object that can be referenced weakly.
        key: the state's name, prefixed by the module that owns it (``agreed_stop.compiled``).
        value: anything.
    """
    entry = _STATE.get(id(obj))
    if entry is None or entry[0]() is not obj:
        key_of = id(obj)
        entry = (weakref.ref(obj, lambda _ref: _STATE.pop(key_of, None)), {})
        _STATE[key_of] = entry
    entry[1][key] = value


def attached(obj: Any, key: str, default: Any = None) -> Any:
    """What `attach` remembered under `key` for `obj`, or `default`.

    Args:
        obj: the object.
        key: the state's name.
        default: returned when nothing was attached.
    """
    entry = _STATE.get(id(obj))
    if entry is None or entry[0]() is not obj:
        return default
    return entry[1].get(key, default)


def detach(obj: Any, key: str) -> None:
    """Forgets `key` for `obj` (nothing if it was not attached).

    Args:
        obj: the object.
        key: the state's name.
    """
    entry = _STATE.get(id(obj))
    if entry is not None and entry[0]() is obj:
        entry[1].pop(key, None)
