"""Runs a part of mirrorkit once a module is imported, before or after mirrorkit.

``import mirrorkit`` does not import TensorFlow or Keras (its public names load lazily),
yet some repairs must be in place as soon as Keras is, without a call to mirrorkit: Keras's
own ``keras.distribution`` API (`mirrorkit.strategies.keras_distribution`). `when_imported`
runs a function right after a module's import completes; where the module is imported
already, at once. A meta path finder (PEP 451), as instrumentation libraries do it: it finds
nothing itself, and wraps the loader of the one module it waits for.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import logging
import sys
import threading
from typing import Any

_LOG = logging.getLogger("mirrorkit")
#: module name -> (the modules, the function ``"package.module:function"``) waiting for it.
_WAITING: dict[str, list[tuple[tuple[str, ...], str]]] = {}
_FINDING = threading.local()
#: The modules a wrapped loader is executing now (in ``sys.modules`` already, not complete).
_LOADING: set[str] = set()


def when_imported(modules: tuple[str, ...], function: str) -> None:
    """Runs `function` once every module of `modules` is imported (at once where they are).

    Args:
        modules: the modules' full names, e.g. ``("keras", "tensorflow")``: each one's
            import must be complete (TensorFlow imports Keras inside its own import, where
            Keras is complete and TensorFlow is not yet).
        function: ``"package.module:function"``, imported and called with no arguments
            once, right after the last of `modules` completes; an error in it is logged,
            never raised into the import.

    Example:
    ```python
    from mirrorkit.patching import post_import

    post_import.when_imported(("keras",), "mirrorkit.strategies.keras_distribution:apply")
    ```
    """
    if all(_imported(module) for module in modules):
        _run(function)
        return
    waiting = (tuple(modules), function)
    for module in modules:
        if not _imported(module) and waiting not in _WAITING.setdefault(module, []):
            _WAITING[module].append(waiting)
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def _imported(module: str) -> bool:
    """Whether `module`'s import is complete (in ``sys.modules``, and not still loading)."""
    return module in sys.modules and module not in _LOADING


def _completed(module: str) -> None:
    """`module`'s import completed: runs what waited for it and for nothing else."""
    for modules, function in _WAITING.pop(module, []):
        if all(other == module or _imported(other) for other in modules):
            _run(function)


def _run(function: str) -> None:
    name, _, attribute = function.partition(":")
    try:
        getattr(importlib.import_module(name), attribute)()
    except Exception as error:  # an import of Keras must not fail because of mirrorkit
        _LOG.warning(
            "%s failed after an import (%s: %s); it is not in place. Report this with "
            "`mirrorkit info`'s output.",
            function,
            type(error).__name__,
            error,
            exc_info=True,  # the traceback for a handler of the user's
        )


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the modules `when_imported` waits for, and runs its functions after each."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in _WAITING or getattr(_FINDING, "name", None) == fullname:
            return None
        _FINDING.name = fullname  # the real finders below answer the search that follows
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            _FINDING.name = None
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader, fullname)
        return spec


class _Loader(importlib.abc.Loader):
    """The module's own loader, then the functions waiting for it."""

    def __init__(self, loader: Any, name: str):
        self._loader = loader
        self._name = name

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        module.__spec__.loader = self._loader  # the module keeps Keras's own loader
        _LOADING.add(self._name)
        try:
            self._loader.exec_module(module)
        finally:
            _LOADING.discard(self._name)
        _completed(self._name)

    def __getattr__(self, name: str) -> Any:  # get_source, is_package, ... as the loader's
        return getattr(self._loader, name)
