"""Every module of mirrorkit that patches Keras or TensorFlow, named in one place, read once.

A module that patches a Keras or TensorFlow module or class defines its repairs at module
level (``REPAIR = Repair(...)`` or ``REPAIRS = (...)``), each saying when it goes in place
(`Repair.when`), and is named here: every public module of `PACKAGES` (a new repair of Keras
is a new module of ``mirrorkit.compat``, found without a line here) and each of `MODULES`.
`repairs` imports them all the first time anything asks, so which repairs exist, and which
``compat.enable`` applies, never depends on what the user or mirrorkit imported first; no
module is imported for its side effects.

The catalogue names modules of every layer by their dotted names and reads them when asked,
at run time, never while ``mirrorkit.patching`` is imported: the mechanism stays below every
part of mirrorkit that patches.

Example:
```python
from mirrorkit.patching import catalogue

print(len(catalogue.repairs()) > 40, catalogue.repairs()[0].defined_in)
```
"""

from __future__ import annotations

import functools
import importlib
import pkgutil

from mirrorkit.patching.repair import Repair

#: Packages whose every public module (not ``_``-prefixed) may define repairs.
PACKAGES = ("mirrorkit.compat",)

#: Modules outside `PACKAGES` that define the patches of a part of mirrorkit, in the order
#: ``compat.active()`` lists their repairs after compat's own.
MODULES = (
    "mirrorkit.feeding.one_iterator",
    "mirrorkit.feeding.validation_split",
    "mirrorkit.scale.fit_notices",
    "mirrorkit.strategies.keras_distribution",
    "mirrorkit.feeding.fit_epoch",
    "mirrorkit.feeding.input_position",
    "mirrorkit.training.step_chain",
    "mirrorkit.faults.backup_pair",
)


def module_names() -> tuple[str, ...]:
    """The dotted names of every module the catalogue reads: `PACKAGES`' first, by name."""
    names = []
    for package in PACKAGES:
        path = importlib.import_module(package).__path__
        for info in sorted(pkgutil.iter_modules(path), key=lambda info: info.name):
            if not info.name.startswith("_"):
                names.append(f"{package}.{info.name}")
    return (*names, *MODULES)


@functools.cache
def repairs() -> tuple[Repair, ...]:
    """Every repair the catalogue's modules define: `PACKAGES`' by name, then `MODULES`'.

    Imports the modules the first time it is called (later calls return the same tuple).

    Returns:
        The repairs, each with `Repair.defined_in` set to its module.

    Raises:
        TypeError: a module's ``REPAIR`` or ``REPAIRS`` holds something that is not a repair.
    """
    found_in_packages: list[Repair] = []
    found_in_modules: list[Repair] = []
    for name in module_names():
        module = importlib.import_module(name)
        defined = vars(module).get("REPAIRS") or (
            (vars(module)["REPAIR"],) if "REPAIR" in vars(module) else ()
        )
        for repair in defined:
            if not isinstance(repair, Repair):
                raise TypeError(f"{name} defines {repair!r} among its repairs: not a Repair")
            repair.defined_in = name
        (found_in_modules if name in MODULES else found_in_packages).extend(defined)
    found_in_packages.sort(key=lambda repair: repair.name)
    return (*found_in_packages, *found_in_modules)


def named(name: str) -> Repair:
    """The catalogue's repair called `name` (``"optimizer_step"``).

    Raises:
        KeyError: no repair has that name; the message lists the names.
    """
    for repair in repairs():
        if repair.name == name:
            return repair
    raise KeyError(f"no repair is named {name!r}; the repairs: {[r.name for r in repairs()]}")
